"""lm-evaluation-harness, as `quality.py` starts it: a child process, so lm-eval's heavy imports
(datasets, pyarrow, scikit-learn) and its threads never enter the daemon. Its chat-completions
model (`local-chat-completions`) asks the endpoint as any client would: no tokenizer (lm-eval
then sends each prompt as chat messages, never counts tokens, and takes no log-probabilities,
so only generation tasks run), one request per item, `--concurrency` at once, temperature 0.
The API key comes from `OPENAI_API_KEY`, which that model reads itself, never from the command
line. The results (lm-eval's, without the per-item samples) go to `results.json` in the run
folder, each item's prompt, reply and score to `samples.jsonl`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = Path(__file__).with_name("quality_task")  # sparkctl's own tasks (`sparkctl_arith`)
UNKNOWN = "unknown task: "  # how the child's last line starts when lm-eval has no such task


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    import lm_eval  # here, in the child: the parent never loads lm-eval
    from lm_eval.tasks import TaskManager

    # lm-eval indexes its ~15,000 shipped tasks in ~5 s: only when the task is not one of ours.
    ours = (TASKS / f"{args.task}.yaml").is_file()
    tasks = TaskManager(include_path=str(TASKS), include_defaults=not ours)
    if args.task not in tasks.all_tasks:
        raise SystemExit(f"{UNKNOWN}lm-eval {lm_eval.__version__} has no task {args.task!r} (`lm-eval ls tasks` "
                         "lists them; a generation task scored by exact match is what the gate reads)")
    model_args = {"model": args.model, "base_url": args.url, "tokenizer_backend": "none",
                  "num_concurrent": args.concurrency, "max_retries": args.retries, "timeout": args.timeout}
    results = lm_eval.simple_evaluate(model="local-chat-completions", model_args=model_args, tasks=[args.task],
                                      limit=args.items, apply_chat_template=True, task_manager=tasks,
                                      log_samples=True, gen_kwargs={"temperature": 0})
    if results is None:
        raise SystemExit("lm-eval returned no results")
    folder = Path(args.output)
    samples = results.pop("samples", {}).get(args.task, [])
    (folder / "samples.jsonl").write_text("".join(json.dumps(s, default=str) + "\n" for s in samples))
    (folder / "results.json").write_text(json.dumps(results, indent=2, default=str))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkctl.bench.lmeval")
    p.add_argument("--url", required=True, help="the endpoint's /v1/chat/completions")
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--items", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--output", required=True)
    return p


if __name__ == "__main__":
    main()

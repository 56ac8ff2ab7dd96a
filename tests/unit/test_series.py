"""The dashboard's time series and charts: rates and medians between consecutive samples, gaps
where an engine did not answer or restarted, memory shares, the switches of the window, and the
SVG drawn from them (axes with units, a line per stack, the switch marked). Pure."""

from __future__ import annotations

import asyncio
import re

import pytest

from sparkctl.bench import metrics
from sparkctl.daemon.charts import CHARTS, chart
from sparkctl.daemon.series import GENERATED, TTFT, Recorder, Sample
from sparkctl.gateway.ledger import Snapshot
from sparkctl.policy.switch import Memory

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0)


def readings(generated: float, ttfts: list[float]) -> dict[str, float]:
    """An engine's counters: `generated` tokens so far, and a TTFT histogram of `ttfts`."""
    text = [f"{GENERATED} {generated}"]
    text += [f'{TTFT}_bucket{{model_name="m",le="{b}"}} {sum(t <= b for t in ttfts)}' for b in BOUNDS]
    text += [f'{TTFT}_bucket{{model_name="m",le="+Inf"}} {len(ttfts)}', f"{TTFT}_count {len(ttfts)}"]
    return metrics.parse("\n".join(text))


def sample(at: float, engines: dict, *, in_flight: int = 0, accepted: int = 0, parked: bool = False) -> Sample:
    requests = Snapshot(served={}, in_flight={"a": in_flight}, accepted={"a": accepted}, peak={}, routed={})
    return Sample(at, engines, requests, Memory({"a": 0.4, "b": 0.1}, 0.9, {"b": 1} if parked else {}))


def sampled(made: Recorder, n: int) -> None:
    """Run the recorder's sampling on a loop of its own until it holds `n` samples."""
    async def run() -> None:
        task = asyncio.create_task(made.run())
        while len(made.samples) < n:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 30))


def recorder(*samples: Sample) -> Recorder:
    made = Recorder(engines=dict, memory=lambda: Memory({}, 0.9), requests=lambda: None)
    made.samples.extend(samples)
    return made


@pytest.mark.parametrize(("ttfts", "median"), [
    ([0.2] * 10, 0.175),  # all in (0.1, 0.25]: halfway up it, by linear interpolation
    ([0.01] * 5 + [0.7] * 5, 0.05),  # the fifth of ten: the top of the first bucket
    ([], None),  # nothing answered in between
])
def test_the_median_comes_from_the_buckets_growth(ttfts: list[float], median: float | None) -> None:
    before, after = readings(0, [0.3] * 4), readings(0, [0.3] * 4 + ttfts)
    found = metrics.quantile(before, after, TTFT, 0.5)
    assert found == pytest.approx(median) if median is not None else found is None


def test_rates_medians_gaps_and_restarts_between_samples() -> None:
    series = recorder(
        sample(100, {"a": readings(1000, [])}),
        sample(105, {"a": readings(1500, [0.2] * 4)}, in_flight=2, accepted=5),
        sample(110, {}),  # the engine did not answer
        sample(115, {"a": readings(40, [])}, parked=True),  # it restarted: its counters began again
    ).series([(90.0, "primary: x → a"), (103.0, "primary: a → b")])
    assert series.at == (105, 110, 115)
    a = series.stacks["a"]
    assert a.tps == (100.0, None, None) and a.ttft_p50_ms[0] == pytest.approx(175.0)
    assert a.in_flight == (2, 0, 0) and a.queued == (3, 0, 0)
    assert series.awake == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.4))
    assert series.parked[-1] == pytest.approx(0.1) and series.free[-1] == pytest.approx(0.5)
    assert series.ceiling == 0.9 and series.switches == ((103.0, "primary: a → b"),)  # 90 s is before the window


@pytest.mark.parametrize("name", list(CHARTS))
def test_every_chart_has_its_units_time_axis_lines_and_switch_marks(name: str) -> None:
    series = recorder(*(sample(100 + 5 * i, {"a": readings(100 * i * i, [0.2] * i)}, in_flight=i, accepted=i)
                        for i in range(6))).series([(112.0, "primary: a → <b>")])
    svg = chart(series, name, now=130)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and f">{CHARTS[name]}</text>" in svg
    assert ">−15 min</text>" in svg and ">now</text>" in svg
    assert "<title>primary: a → &lt;b&gt;</title>" in svg  # marked, and escaped
    lines = re.findall(r'<polyline [^>]*points="([^"]+)"', svg)
    assert lines and all(len(points.split()) >= 2 for points in lines)
    if name == "memory":
        assert ">100%</text>" in svg and ">ceiling</text>" in svg


def test_no_samples_yet_draws_an_empty_chart_that_says_so() -> None:
    svg = chart(recorder().series([]), "tps", now=0)
    assert "no samples yet" in svg and "<polyline" not in svg


def test_the_recorder_samples_on_its_loop_until_cancelled() -> None:
    ledger = Snapshot(served={}, in_flight={"a": 1}, accepted={"a": 1}, peak={}, routed={})
    made = Recorder(engines=lambda: {"a": readings(10, [])}, memory=lambda: Memory({"a": 0.4}, 0.9),
                    requests=lambda: ledger, every=0.01)
    sampled(made, 3)
    assert made.series([]).stacks["a"].in_flight[0] == 1


def test_a_failing_read_leaves_a_gap_and_the_sampler_goes_on() -> None:
    reads = iter([RuntimeError("Docker restarting"), {"a": readings(10, [])}, {"a": readings(20, [])}])

    def engines() -> dict:
        answer = next(reads, {"a": readings(30, [])})
        if isinstance(answer, Exception):
            raise answer
        return answer

    ledger = Snapshot(served={}, in_flight={}, accepted={}, peak={}, routed={})
    made = Recorder(engines=engines, memory=lambda: Memory({}, 0.9), requests=lambda: ledger, every=0.01)
    sampled(made, 2)
    assert [s.engines["a"][GENERATED] for s in made.samples][:2] == [10, 20]

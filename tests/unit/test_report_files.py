"""The dashboard reads a written report's files through the API: only files inside a report's own
folder, never the state dir's other files (its database, desired.yaml) or anything a link points at."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.daemon.reads import report_file
from sparkctl.errors import NoSuchFile


def test_only_a_reports_own_files_are_given(tmp_path: Path) -> None:
    folder = tmp_path / "reports" / "20261201-1200"
    (folder / "graphs").mkdir(parents=True)
    (folder / "comparison.md").write_text("# report")
    (folder / "graphs" / "decode.png").write_bytes(b"png")
    (tmp_path / "sparkctl.db").write_text("secret state")
    (tmp_path / "reports" / "loose.md").write_text("not a report")
    (folder / "escape.md").symlink_to(tmp_path / "sparkctl.db")
    assert report_file(tmp_path, "reports/20261201-1200", "graphs/decode.png") == folder / "graphs" / "decode.png"
    for report, path in (("reports/20261201-1200", "../../sparkctl.db"), ("reports/..", "sparkctl.db"),
                         ("reports/.", "loose.md"), ("reports", "loose.md"), ("state/x", "comparison.md"),
                         ("reports/20261201-1200", "escape.md"), ("reports/20261201-1200", "/etc/passwd"),
                         ("reports/20261201-1200", "graphs"), ("../reports/20261201-1200", "comparison.md"),
                         ("reports/20261201-1200/graphs", "decode.png"), ("bench/20261201-1200", "comparison.md")):
        with pytest.raises(NoSuchFile):
            report_file(tmp_path, report, path)

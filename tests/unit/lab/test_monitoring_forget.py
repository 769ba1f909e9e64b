"""`lab down` forgets the lab's Prometheus series and drift textfile (monitoring.stop(forget=True)): a lab booted
later in the same folder (the next test module of a shard) once read a host of the lab before it (lab3 of a 3-host
lab in a 2-host one). A plain stop (monitoring restarted on a running lab) keeps them. Folders made in a temp dir."""

from __future__ import annotations

from pathlib import Path

from knobfleet.lab import monitoring


def _kept(lab: Path) -> Path:
    tsdb = monitoring.monitoring_dir(lab) / "tsdb" / "01ABC"
    tsdb.mkdir(parents=True)
    (tsdb / "chunks").write_text("x")
    monitoring.textfile_dir(lab).mkdir(parents=True)
    (monitoring.textfile_dir(lab) / "knobfleet.prom").write_text("knobfleet_drift 1\n")
    (monitoring.monitoring_dir(lab) / "prometheus.yml").write_text("scrape_configs: []\n")
    return tsdb


def test_a_plain_stop_keeps_the_series(tmp_path: Path) -> None:
    tsdb = _kept(tmp_path)
    assert monitoring.stop(tmp_path) == []
    assert tsdb.is_dir() and (monitoring.textfile_dir(tmp_path) / "knobfleet.prom").is_file()


def test_lab_down_forgets_the_series_and_the_textfile(tmp_path: Path) -> None:
    _kept(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("k")
    assert monitoring.stop(tmp_path, forget=True) == []
    assert not (monitoring.monitoring_dir(tmp_path) / "tsdb").exists()
    assert not monitoring.textfile_dir(tmp_path).exists()
    assert (monitoring.monitoring_dir(tmp_path) / "prometheus.yml").is_file() and (outside / "keep").is_file()

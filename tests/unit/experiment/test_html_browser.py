"""Every report kind opened in headless Chromium (Debian's package; `make test` installs it) with the network off:
the page loads with no request to any URL and no console message, its plots are there, and a screenshot is kept
under build/artifacts/report/ (also the README's picture).

The network is off three times over:
- Chromium runs in an empty network namespace (`unshare -n`: only a loopback that is down);
- every host name resolves to nothing (`--host-resolver-rules`), and the proxy is 127.0.0.1:9;
- the page's own Content-Security-Policy is `default-src 'none'`.

Chromium's own background services still queue requests (its component updater, whatever the flags say), which
can reach nothing there. The check reads Chromium's net-log for requests made on the page's behalf (their
network isolation key is the page's site, file://): none may exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from knobfleet.experiment import html
from tests.conftest import REPO
from tests.unit.experiment import test_canary_run as fleet
from tests.unit.experiment.test_html import ab_doc, bench_doc, canary_record, fleet_doc
from tests.unit.experiment.test_html_ab import ab_doc_with_latency

profile, router = fleet.profile, fleet.router  # the fake fleet's fixtures
ARTIFACTS = REPO / "build" / "artifacts" / "report"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,1600",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--no-first-run", "--disable-extensions",
    "--disable-breakpad", "--no-pings", "--disable-domain-reliability", "--enable-logging=stderr", "--v=0",
]  # fmt: skip


def _cannot_run() -> str | None:
    if not shutil.which("chromium"):
        return "chromium is missing: apt-get install -y chromium (make test does this)"
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "an empty network namespace needs root and unshare"
    return None


@pytest.fixture(scope="module", autouse=True)
def browser() -> None:
    reason = _cannot_run()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but {reason}")
        pytest.skip(f"LOUD SKIP: {reason}")


def open_in_chromium(page: str, name: str, tmp: Path) -> tuple[list[str], list[str]]:
    """Load ``page``; return the requests made on its behalf and the console lines; keep its screenshot."""
    target = tmp / f"{name}.html"
    target.write_text(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    netlog = tmp / f"{name}.netlog.json"
    proc = subprocess.run(
        ["unshare", "-n", "chromium", *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={netlog}",
         f"--screenshot={ARTIFACTS / (name + '.png')}", target.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and (ARTIFACTS / f"{name}.png").is_file(), proc.stderr[-2000:]
    log: dict[str, Any] = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    own = [e["params"]["url"] for e in log["events"] if e["type"] == start
           and "file://" in str(e.get("params", {}).get("network_isolation_key", ""))]  # fmt: skip
    # the page's console only: Chromium's own pages (chrome://resources/...) may log about the blocked network
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln and "source: chrome://" not in ln]
    return own, console


def test_the_browser_check_sees_a_page_that_reaches_out(tmp_path: Path) -> None:
    """The check itself: a page with a remote image and a console error is caught on both counts."""
    bad = '<html><body><img src="http://example.invalid/x.png"><script>console.error("boom")</script></body></html>'
    requests, console = open_in_chromium(bad, "negative-control", tmp_path)
    assert requests == ["http://example.invalid/x.png"] and any('"boom"' in ln for ln in console)


def test_a_tune_campaigns_page_opens_offline_with_no_request_and_no_console_message(tmp_path: Path) -> None:
    """The page of a whole campaign (the seed space over the stand-in's model): every stage, its plots."""
    from knobfleet.tune.report import tune_page
    from tests.unit.tune.tune_fixtures import seed_record

    page = tune_page(seed_record(tmp_path))
    requests, console = open_in_chromium(page, "tune", tmp_path)
    assert requests == [] and console == [], (requests, console)
    assert "1. Model: 15 candidates" in page and (ARTIFACTS / "tune.png").stat().st_size > 10_000
    assert page.count("<svg") == 2  # the model's predictions, the engine stage's A/Bs


@pytest.mark.parametrize("kind", ["canary-rolled-back", "canary-promoted", "ab", "ab-latency", "bench", "fleet"])
def test_a_report_opens_offline_with_no_request_and_no_console_message(
    profile: Any, router: Any, tmp_path: Path, kind: str
) -> None:
    if kind == "fleet":
        page = html.fleet_page(fleet_doc(), "drift: inventories/lab")
    else:
        docs = {"ab": ab_doc, "ab-latency": ab_doc_with_latency, "bench": bench_doc}
        doc = docs[kind]() if kind in docs else canary_record(profile, 0.55 if kind.endswith("back") else 1.0)
        if kind.startswith("ab"):  # what `ab` reads from the host at its end (experiment.running)
            doc |= {"generations": {"lab1": 7}, "engine_versions": {"lab1": "0.5.23"}}
        page = html.render(doc)
    requests, console = open_in_chromium(page, kind, tmp_path)
    assert requests == [] and console == [], (requests, console)
    assert page.count("<svg") == {"ab": 2, "ab-latency": 4}.get(kind, 1)
    if kind != "fleet":  # issue 58: each page names the profile, the generation the host ran and the engine version
        named = {"bench": ["bench of ctas512@2, generation 0004 on lab1", "<td class=l>generation on lab1</td><td "
                           "class=l>0004", "<td class=l>engine</td><td class=l>0.5.23</td>"],
                 "ab": ["A: default@1", "B: ctas512@2", "<td class=l>generation on lab1</td><td class=l>0007",
                        "<td class=l>engine on lab1</td><td class=l>0.5.23</td>"]}  # fmt: skip
        named["ab-latency"] = named["ab"]
        for kind_ in ("canary-rolled-back", "canary-promoted"):
            named[kind_] = ["profile: ctas512", "<td class=l>generation on h1</td><td class=l>0001",
                            "<td class=l>engine on h1</td><td class=l>0.5.23</td>"]  # fmt: skip
        assert all(text in page for text in named[kind]), [t for t in named[kind] if t not in page]
    assert (ARTIFACTS / f"{kind}.png").stat().st_size > 30_000  # the plots and tables were drawn, not a blank page

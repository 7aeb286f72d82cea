"""Make docs/report.png, the README's picture of a real report: `tracelake run` on PARAM's
8-rank DLRM trace (../shared/corpus/param/et_replay/tests/inputs/dlrm_kineto, MIT licence,
PROVENANCE.md there), then the first screen of report.html in headless Debian chromium.

  python scripts/screenshot.py [--corpus DIR] [--out docs/report.png]

Needs the test environment (playwright) and /usr/bin/chromium (scripts/install-browser.sh).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "report.png")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    traces = a.corpus / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        tracelake = Path(sys.executable).parent / "tracelake"
        subprocess.run(
            [str(tracelake), "run", str(traces), "--lake", str(Path(tmp) / "lake"), "-o", str(html), "-q"],
            check=True,
        )
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=a.chromium, args=["--no-sandbox", "--disable-gpu"])
            page = b.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
            page.goto(html.as_uri())
            page.wait_for_timeout(1500)  # the charts below the fold draw; the first screen is text
            page.screenshot(path=str(a.out))
            b.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

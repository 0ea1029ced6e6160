"""Headless Chromium driving the attention explorer served by a real `attnkit serve` process on loopback.

The browser tests use it; run as a script it writes a screenshot of each view (the README's pictures):

    python tests/browser.py --checkpoint runs/multi30k/checkpoints/avg5.safetensors \\
        --text "Ein Mann fährt mit dem Fahrrad über eine Brücke." --out docs/

Needs Debian's `chromium` and `chromium-driver` packages and `pip install selenium`; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def missing() -> str | None:
    """What the browser tests lack, in words (None: they can run)."""
    lacking = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        lacking.append("the selenium package (pip install selenium)")
    if CHROMIUM is None:
        lacking.append("a chromium executable (apt-get install chromium)")
    if DRIVER is None:
        lacking.append("chromedriver (apt-get install chromium-driver)")
    return ", ".join(lacking) or None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(checkpoint: str | Path, *options: str) -> Iterator[str]:
    """`attnkit serve` of `checkpoint` as its own process on 127.0.0.1 while the block runs; yields its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", str(checkpoint), "--port",
                             str(port), "--device", "cpu", *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                log = proc.stdout.read().decode()[-2000:]
                raise RuntimeError(f"attnkit serve exited with {proc.returncode}: {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("attnkit serve did not answer /health within 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def chromium(width: int = 1300, height: int = 1000):
    """A headless Chromium (the system's executable and driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


class Explorer:
    """The page as a user drives it, and what it draws, read back from the elements' data-* attributes."""

    def __init__(self, driver, url: str):
        self.driver = driver
        driver.get(url + "/")
        self.wait(lambda d: d.execute_script("return document.body.dataset.state") == "ready")

    def wait(self, condition, timeout: float = 60):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout).until(condition)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def el(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def fill(self, element_id: str, value) -> None:
        box = self.el(element_id)
        box.clear()
        box.send_keys(str(value))

    def ask(self, text: str, button: str = "go", **numbers) -> None:
        """Type `text` (and beam, nbest, ...), press `button`, wait for the answer."""
        self.fill("text", text)
        for name, value in numbers.items():
            self.fill(name, value)
        self.js("document.body.dataset.state = 'asking'")
        self.el(button).click()
        self.wait(lambda d: d.execute_script("return document.body.dataset.state") in ("ready", "error"))
        assert self.js("return document.body.dataset.state") == "ready", self.el("status").text

    def select(self, element_id: str, value) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.el(element_id)).select_by_value(str(value))

    def view(self, name: str) -> None:
        self.js("document.querySelector(`#views button[data-view='${arguments[0]}']`).click()", name)

    def lines(self) -> list[tuple[int, int, int, float]]:
        """The head view's lines: (head, query, key, weight)."""
        return [tuple(x) for x in self.js(
            "return [...document.querySelectorAll('#headview line.attn')].map((l) => "
            "[+l.dataset.head, +l.dataset.i, +l.dataset.j, +l.dataset.w])")]

    def tokens(self, side: str) -> list[tuple[str, bool]]:
        """The head view's query ('left') or key ('right') tokens: (text, drawn as memory)."""
        return [tuple(x) for x in self.js(
            "return [...document.querySelectorAll('#headview text.tok.' + arguments[0])].map((t) => "
            "[t.textContent, t.classList.contains('memory')])", side)]

    def heatmap(self) -> list[list[float]]:
        return self.js("return [...document.querySelectorAll('#grid tr')].slice(1).map((tr) => "
                       "[...tr.querySelectorAll('td')].map((td) => +td.dataset.w))")

    def summary(self) -> list[dict]:
        """Per query row: {head: (arg-max key, entropy)} with head 'mean' for the mean of heads."""
        return self.js("return [...document.querySelectorAll('#summary tr[data-i]')].map((tr) => {"
                       "  const a = [...tr.querySelectorAll('td.argmax')];"
                       "  const e = [...tr.querySelectorAll('td.entropy')];"
                       "  return Object.fromEntries(a.map((c, n) => "
                       "    [c.dataset.head, [c.textContent, +e[n].textContent]]));"
                       "})")

    def screenshot(self, path: str | Path) -> None:
        self.driver.save_screenshot(str(path))


def screenshots(checkpoint: str, text: str, out: Path, beam: int = 4, nbest: int = 2) -> list[Path]:
    """One PNG per view of `text` through a served `checkpoint`: explorer-{head,model,heatmap,summary}.png."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with served(checkpoint) as url:
        driver = chromium()
        try:
            page = Explorer(driver, url)
            page.ask(text, beam=beam, nbest=nbest)
            for view, kind in (("head", "cross"), ("model", "encoder"), ("heatmap", "cross"), ("summary", "cross")):
                page.select("kind", kind)
                page.view(view)
                written.append(out / f"explorer-{view}.png")
                page.screenshot(written[-1])
        finally:
            driver.quit()
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="screenshots of the attention explorer, one per view")
    parser.add_argument("--checkpoint", required=True, help="a translation checkpoint")
    parser.add_argument("--text", required=True, help="the sentence to translate")
    parser.add_argument("--out", default="docs", help="folder for explorer-*.png")
    args = parser.parse_args()
    if missing():
        sys.exit(f"cannot drive a browser: missing {missing()}")
    for path in screenshots(args.checkpoint, args.text, Path(args.out)):
        print(f"wrote {path}")

"""The student's view in a real browser: JupyterLab on 127.0.0.1 driven by headless Chromium.

Notebook 09, finished (the reference) up to its training cell, is opened, run from
the Run menu, saved, its kernel shut down, and opened again, as a student does the
next day: its plots must be rendered and no output may say "Error displaying widget"
(a widget's view outlives the kernel that held the widget). The browser is the
system's Chromium (Debian's ``chromium``, which ``.ci/run`` installs where apt can),
driven by the ``playwright`` package through ``executable_path``: no browser download.
Skipped where Chromium, playwright or JupyterLab is missing.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

build = pytest.importorskip("tinytrain.course.build")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyterlab")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH")]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "09_training.ipynb"
EPOCHS = 3  # the training cell's 20 epochs, cut to keep the test short: the bars and the plot are the same


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _finished_notebook(folder: Path) -> Path:
    notebook = build.reference_notebook(ROOT / "modules" / "09_training" / "09_training.py")
    [training] = [number for number, cell in enumerate(notebook.cells) if "digits_trainer.fit(" in cell.source]
    notebook.cells = notebook.cells[: training + 1]
    assert "epochs = 20" in notebook.cells[training].source
    notebook.cells[training].source = notebook.cells[training].source.replace("epochs = 20", f"epochs = {EPOCHS}")
    path = folder / NOTEBOOK
    nbformat.write(notebook, path)
    return path


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving ``folder``, with a token of its own."""

    def __init__(self, folder: Path) -> None:
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        settings = folder.parent / "jupyter"  # no user settings, no workspace from another run
        tracker = settings / "lab-settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True)
        tracker.write_text('{"windowingMode": "none"}')  # every cell drawn, not only those in view
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(settings / "config"),
                   JUPYTERLAB_SETTINGS_DIR=str(settings / "lab-settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(settings / "workspaces"))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={folder}",
             "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],  # CI containers
            env=env, stdout=subprocess.DEVNULL, stderr=open(folder.parent / "jupyterlab.log", "w"))
        deadline = time.monotonic() + 180  # a busy 2-core machine takes over a minute
        while True:
            try:
                self.api("status")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()  # a server that is still starting must not outlive the test
                    raise RuntimeError("JupyterLab did not start: "
                                       + (folder.parent / "jupyterlab.log").read_text()[-2000:]) from None
                time.sleep(0.5)

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def stop_kernels(self) -> None:
        for kernel in self.api("kernels"):
            self.api(f"kernels/{kernel['id']}", method="DELETE")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _open(page, lab: JupyterLab) -> None:
    """Open the notebook and wait until its kernel is idle (a new kernel: the old one was shut down)."""
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=120_000)


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def test_a_finished_notebook_runs_saves_and_reopens_with_its_plots_and_no_widget_errors(tmp_path: Path) -> None:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    path = _finished_notebook(folder)
    cells = len(nbformat.read(path, as_version=4).cells)
    lab = JupyterLab(folder)
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                 args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _open(page, lab)
            _menu(page, "Run", "Run All Cells")
            deadline = time.monotonic() + 480
            while True:  # every code cell numbered, none still waiting ([*])
                prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
                if prompts and all(any(ch.isdigit() for ch in prompt) for prompt in prompts):
                    break
                assert time.monotonic() < deadline, f"the notebook did not finish: {prompts}"
                time.sleep(1)
            assert page.get_by_text("Error displaying widget").count() == 0
            page.keyboard.press("Control+s")
            deadline = time.monotonic() + 30
            while not any(cell.get("outputs") for cell in nbformat.read(path, as_version=4).cells[-1:]):
                assert time.monotonic() < deadline, "the notebook was not saved"
                time.sleep(0.5)

            lab.stop_kernels()  # the next day: the widgets died with the kernel
            page.close()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _open(page, lab)
            page.locator(".jp-OutputArea-output img").first.wait_for(timeout=30_000)
            assert page.locator(".jp-Notebook .jp-Cell").count() == cells
            assert page.locator(".jp-OutputArea-output img").count() >= 2  # Module 09's plots, the history's too
            assert page.get_by_text(f"training: 100%").count() == 1  # the bar of epochs, saved as text
            assert page.get_by_text("Error displaying widget").count() == 0
            browser.close()
    finally:
        lab.close()
    saved = path.read_text()
    assert "application/vnd.jupyter.widget-view+json" not in saved
    assert f"{EPOCHS}/{EPOCHS}" in saved

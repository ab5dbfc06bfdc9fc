"""The operations guide's commands are the real ones: every shell block of deploy/README.md
marked `<!-- runs-here -->` runs, in order, against a fresh embedded store (`ASO_CONFIG` its
config, `ASO_TMP` a scratch directory, the checkout as working directory), and must succeed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aso.config import Config
from tests.conftest import own_store

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "deploy" / "README.md"
MARK = "<!-- runs-here -->"


def runnable_blocks(text: str) -> list[str]:
    """The shell blocks that directly follow a runs-here mark."""
    pattern = re.compile("^" + re.escape(MARK) + r"\s*\n```(?:sh|bash)\n(.*?)\n```", re.S | re.M)
    blocks = pattern.findall(text)
    marks = re.findall("^" + re.escape(MARK) + "$", text, re.M)
    assert len(marks) == len(blocks), "a runs-here mark not followed by a sh block"
    return blocks


BLOCKS = runnable_blocks(GUIDE.read_text())


@pytest.fixture(scope="module")
def guide_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A store of its own, as the guide's reader has after `aso config init`."""
    base = tmp_path_factory.mktemp("guide")
    with own_store(base) as (config, _store):
        assert isinstance(config, Config) and config.source is not None
        env = dict(os.environ)
        env.update(
            ASO_CONFIG=str(config.source),
            ASO_TMP=str(base),
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        )
        env.pop("REQUESTS_CA_BUNDLE", None)
        yield env


def test_the_guide_has_commands_that_run_here():
    assert len(BLOCKS) >= 6
    assert "@@" not in GUIDE.read_text(), "a section of the guide is still a placeholder"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.splitlines()[0][:60] for b in BLOCKS])
def test_guide_block_runs(block: str, guide_env: dict[str, str]):
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=ROOT,
        env=guide_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (
        f"{block}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )

"""The README's command after the demo serves the policy the demo trained, at the
address the README says to open."""

import pathlib
import re
import shlex
import subprocess
import sys

from experiments.configs import grpo_hle
from orchestra_jax.training.policy_engines import is_policy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _flags(args: list[str]) -> dict[str, str]:
    assert all(a.startswith("--") and "=" in a for a in args), args
    return dict(a.split("=", 1) for a in args)


def test_the_serve_command_serves_the_demos_checkpoint():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    demo_block, serve_block = re.findall(r"```bash\n(.*?)```", readme, re.S)[:2]
    demo = shlex.split(demo_block.split("&&")[-1])
    serve = shlex.split(serve_block)
    assert demo[:3] == ["python", "-m", "experiments.grpo_hle"], demo
    assert serve[:3] == ["python", "-m", "orchestra_jax.serve"], serve
    demo_flags, serve_flags = _flags(demo[3:]), _flags(serve[3:])
    assert serve_flags["--config"] == demo_flags["--config"]
    # The demo writes to its default workdir, runs/<variant>, which the README names.
    variant = demo_flags["--config"].rsplit(":", 1)[1]
    assert grpo_hle.get_config(variant).workdir == ""
    workdir = f"runs/{variant}"
    assert f"`{workdir}/` fills with" in readme
    assert serve_flags["--policy"] == f"checkpoint:{workdir}"
    assert is_policy(serve_flags["--policy"])

    # The page's address in the README is where the server listens by default.
    help_text = subprocess.run(
        [sys.executable, "-m", "orchestra_jax.serve", "--helpfull"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    host = re.search(r"--host: .*?\n\s*\(default: '([^']*)'\)", help_text, re.S)
    port = re.search(r"--port: .*?\n\s*\(default: '([^']*)'\)", help_text, re.S)
    assert host and port, help_text[-2000:]
    url = f"http://{host.group(1)}:{port.group(1)}/"
    assert f"open {url} in a browser" in " ".join(readme.split())

"""The environment fingerprint: what a timing depends on besides the kernel."""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata

import torch


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _driver() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def fingerprint(device: torch.device) -> dict[str, str]:
    """Device, driver and library versions; resuming a run compares these."""
    env = {
        "device": "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env.update(
            device=torch.cuda.get_device_name(device),
            capability=f"{major}.{minor}",
            cuda=str(torch.version.cuda),
            driver=_driver(),
            triton=_version("triton"),
            cupy=_version("cupy-cuda13x") if _version("cupy-cuda13x") != "absent"
            else _version("cupy-cuda12x"),
        )
    else:
        env["processor"] = platform.processor() or platform.machine()
    return env

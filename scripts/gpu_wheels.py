"""Fetch the wheels the lent GPU machine lacks into ``.whl/`` (it reaches no registry).

    python scripts/gpu_wheels.py            # then carry ".whl" in the device call

``benchmarks/gpu_run.sh`` installs whatever lies in ``.whl/``. The machine's image has
torch, triton, cupy, numpy, pyyaml and the usual small packages; it lacks pydantic,
optuna's stack, deap (and moocore, which deap's tools import), rich and Ray. Ray's
wheel (76 MiB) alone is over the 64 MiB a device call may carry, so it is re-zipped
without the parts evokernel never imports (the Java jar, rllib, data, serve, llm, train,
tune, source maps) and with LZMA rather than deflate (pip reads both; its three native
binaries shrink by a third): about 28 MiB. The versions are the ones CI tests here; the target is CPython 3.12 on x86-64, what the
GPU machine runs.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

WHEELS = [
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
    "typing-inspection==0.4.5", "typing-extensions==4.16.0",
    "optuna==5.1.0", "alembic==1.20.1", "sqlalchemy==2.1.9", "mako==1.4.3", "colorlog==6.12.0",
    # deap's tools import moocore (with cffi, pycparser and platformdirs), absent from the image
    "deap==1.4.4", "moocore==0.3.2", "cffi==2.1.1", "pycparser==3.12", "platformdirs==4.14.9",
    "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0",
    "ray==2.60.0", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0", "rpds-py==2026.9.1",
    # CUPTI kernel spans, FlashInfer-Bench's timing (the image has its libcupti and cuda-bindings)
    "cupti-python==13.0.1",
]
EVALUATION = [w for w in WHEELS if w.split("==")[0] in (
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "rich", "markdown-it-py", "mdurl", "pygments", "cupti-python")]
"""Enough for the judge, the benchmarks that evaluate and the GPU tests (no Ray, no search)."""
RAY_ONLY = ("ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py")
NO_RAY = [w for w in WHEELS if w.split("==")[0] not in RAY_ONLY]
"""Everything but Ray (the search's runtime), 30 MiB lighter, for calls whose tree leaves no
room for Ray (evaluator_throughput.py's old design imports the populations, so deap stays);
see WHEELS in benchmarks/gpu_run.sh."""
CHOICES = {"all": WHEELS, "evaluation": EVALUATION, "noray": NO_RAY}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
RAY_DROP = ("ray/jars/", "ray/rllib/", "ray/data/", "ray/serve/", "ray/llm/", "ray/train/",
            "ray/tune/")
LIMIT_MIB = 60.0
"""What the wheels may take of the 64 MiB a call carries; the repository needs the rest."""


def download(dest: Path, specs: list[str]) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *specs],
        check=True,
    )


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def slim_ray(wheel: Path) -> Path:
    """Re-zip Ray's wheel without the dropped packages, LZMA-compressed; its RECORD stays consistent."""
    out = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_LZMA) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        kept = [n for n in src.namelist()
                if not n.startswith(RAY_DROP) and not n.endswith(".js.map") and n != record_name]
        lines = []
        for name in kept:
            data = src.read(name)
            dst.writestr(src.getinfo(name), data, compress_type=zipfile.ZIP_LZMA)
            lines.append(f"{name},{_record_hash(data)},{len(data)}")
        lines.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_LZMA)
    out.replace(wheel)
    return wheel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dest", type=Path, default=Path(__file__).resolve().parent.parent / ".whl")
    p.add_argument("--only", choices=list(CHOICES), default="all",
                   help="evaluation: the judge and the benchmarks that only evaluate (about 5 MiB); "
                        "noray: all but Ray (every stage but search)")
    args = p.parse_args(argv)
    args.dest.mkdir(exist_ok=True)
    download(args.dest, CHOICES[args.only])
    for wheel in args.dest.glob("ray-*.whl"):
        if wheel.stat().st_size > 45 * 2**20:
            slim_ray(wheel)
    sizes = {w.name: w.stat().st_size / 2**20 for w in sorted(args.dest.glob("*.whl"))}
    for name, mib in sizes.items():
        print(f"{mib:7.2f} MiB  {name}")
    total = sum(sizes.values())
    print(f"{total:7.2f} MiB  in {len(sizes)} wheels under {args.dest}")
    if total > LIMIT_MIB:
        print(f"over {LIMIT_MIB} MiB: a device call could not carry them with the repository")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bundle on arm64, emulated: its predict.py classifies the test split in an arm64 userland under qemu-user (Debian's
`qemu-user-static`) with the aarch64 wheels of onnxruntime, tokenizers and numpy from the package registry, and the
labels are compared with the same predict.py run natively here. Timings under emulation are indicative only.

    make test-arm64 [BUNDLE=runs/demo/final] [ARM64_N=200]
    .venv/bin/python benchmarks/arm64.py --bundle runs/demo/final [--n 200] [--work .cache/arm64]

The userland is a sysroot of Debian bookworm's arm64 packages (python3.11 and the libraries it links), unpacked
without installing anything on the host; `qemu-aarch64-static -L SYSROOT` runs its python. /sys is hidden in a
private mount namespace (`unshare -m`, root): onnxruntime's cpuinfo reads the x86 host's /sys/devices/system/cpu there
and crashes under qemu. Writes benchmarks/results/arm64.json.
"""

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import onnxruntime
import tokenizers
from harness import provenance, write_results

from edgepress.data import DataConfig, load_data

OUT = Path(__file__).parent / "results" / "arm64.json"
# python3.11 and what it links, from Debian bookworm arm64 (versions from the mirror's index)
DEBS = ("libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libffi8", "libssl3", "libbz2-1.0", "liblzma5",
        "libsqlite3-0", "libuuid1", "libncursesw6", "libtinfo6", "libreadline8", "libdb5.3", "libgdbm6", "libnsl2",
        "libtirpc3", "libcrypt1", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0", "libcom-err2",
        "libkeyutils1", "media-types", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
        "python3.11")
PLATFORMS = ("--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64")


def sysroot(work: Path) -> Path:
    """Debian's arm64 python3.11 unpacked into WORK/sysroot (apt-get download with the architecture overridden and
    its own state dirs: the host's apt is untouched)."""
    root = work / "sysroot"
    if (root / "usr/bin/python3.11").is_file():
        return root
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    options = [
        "-o",
        "APT::Architecture=arm64",
        "-o",
        "APT::Architectures=arm64",
        "-o",
        f"Dir::State::Lists={work / 'lists'}",
        "-o",
        f"Dir::Cache={work / 'cache'}",
    ]
    (work / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", *options, "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", *options, "download", *DEBS], check=True, cwd=debs, stdout=subprocess.DEVNULL)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


def site_packages(work: Path) -> Path:
    """The aarch64 wheels of the three packages, at the versions installed here, into WORK/site."""
    site = work / "site"
    if (site / "onnxruntime").is_dir():
        return site
    pins = [
        f"onnxruntime=={onnxruntime.__version__}",
        f"tokenizers=={tokenizers.__version__}",
        f"numpy=={numpy.__version__}",
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            *PLATFORMS,
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--target",
            str(site),
            *pins,
        ],
        check=True,
    )
    return site


def emulated(root: Path, site: Path, args: list[str]) -> str:
    """stdout of the sysroot's python3.11 under qemu-aarch64-static, with /sys hidden."""
    python = f"qemu-aarch64-static -L {root} {root}/usr/bin/python3.11"
    script = f"mount -t tmpfs none /sys && exec {python} {shlex.join(args)}"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": "/root"}
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"arm64 run failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle dir (with predict.py)")
    parser.add_argument("--n", type=int, default=200, help="test sentences (0: all 1,057; ~0.8 s each emulated)")
    parser.add_argument("--work", type=Path, default=Path(".cache/arm64"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if shutil.which("qemu-aarch64-static") is None:
        raise SystemExit("qemu-aarch64-static not found. Fix: apt-get install qemu-user-static")
    bundle, work = args.bundle.resolve(), args.work.resolve()
    id2label = json.loads((bundle / "config.json").read_text())["id2label"]
    data = load_data(DataConfig(), {name: int(k) for k, name in id2label.items()})  # the demo's test split
    texts = list(data.test.texts[: args.n or None])
    work.mkdir(parents=True, exist_ok=True)
    (work / "texts.txt").write_text("\n".join(texts), encoding="utf-8")
    (work / "bench.txt").write_text("\n".join(texts[:5]), encoding="utf-8")
    root, site = sysroot(work), site_packages(work)
    run = [str(bundle / "predict.py"), "--file", str(work / "texts.txt"), "--json"]
    native = [
        json.loads(line)["label"]
        for line in subprocess.run(
            [sys.executable, *run], check=True, capture_output=True, text=True
        ).stdout.splitlines()
    ]
    arm = [json.loads(line)["label"] for line in emulated(root, site, run).splitlines()]
    bench = [str(bundle / "predict.py"), "--file", str(work / "bench.txt"), "--bench", "--runs", "20", "--json"]
    timing = {
        "native": json.loads(
            subprocess.run([sys.executable, *bench], check=True, capture_output=True, text=True).stdout
        ),
        "arm64_emulated": json.loads(emulated(root, site, bench)),
    }
    agree = sum(a == b for a, b in zip(arm, native, strict=True))
    result = {
        "provenance": provenance(),
        "bundle": str(args.bundle),
        "n": len(texts),
        "agreement": agree / len(texts),
        "agreeing": agree,
        "differing": [i for i, (a, b) in enumerate(zip(arm, native, strict=True)) if a != b],
        "timing_indicative_only": timing,
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
        "userland": "Debian bookworm arm64 python3.11 under qemu-aarch64-static",
    }
    write_results(args.out, result)
    print(
        f"arm64 (emulated) vs {platform.machine()}: {agree} of {len(texts)} labels agree; "
        f"b1 x 128 p50 {timing['arm64_emulated']['fixed']['p50_ms']:.1f} ms emulated vs "
        f"{timing['native']['fixed']['p50_ms']:.1f} ms native; {args.out}"
    )


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()

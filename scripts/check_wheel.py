"""Check a built protoprompt wheel before anyone installs it.

* its file name and WHEEL tags: abi3 for CPython >= 3.10 on the expected platform tag;
* its METADATA: the expected version, the license file;
* its contents: the typed package (``py.typed``, ``_core.pyi``) and one native module;
* on Linux, the ELF of the native module (read with ``objdump -p``, the check auditwheel
  makes): a manylinux wheel needs GLIBC symbol versions of at most ``--max-glibc`` and links
  only libraries every manylinux system has; a musllinux wheel links musl's libc alone.

    python scripts/check_wheel.py dist/protoprompt-*-manylinux_2_17_x86_64*.whl \
        --platform manylinux_2_17_x86_64 --max-glibc 2.17 --version 0.2.0
    python scripts/check_wheel.py dist/protoprompt-*-musllinux_1_2_x86_64.whl \
        --platform musllinux_1_2_x86_64 --version 0.2.0
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Libraries a manylinux wheel may link without bundling them (PEP 599's list, minus the
# graphics ones a token packer has no business with).
ALLOWED_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libgcc_s.so.1",
    "libresolv.so.2",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
MUSL_LIBS = {"libc.so", "libgcc_s.so.1"}


def fail(message: str) -> None:
    raise SystemExit(f"check_wheel: {message}")


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def wheel_tags(wheel: zipfile.ZipFile, dist_info: str) -> list[str]:
    wheel_file = wheel.read(f"{dist_info}/WHEEL").decode()
    if "Root-Is-Purelib: false" not in wheel_file:
        fail("WHEEL must say Root-Is-Purelib: false (the package has a native module)")
    return re.findall(r"^Tag: (\S+)$", wheel_file, re.MULTILINE)


def elf_needs(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """DT_NEEDED libraries and the symbol versions required from each (objdump -p)."""
    if shutil.which("objdump") is None:
        fail("objdump is needed to read the native module (Debian: apt-get install binutils)")
    out = subprocess.run(
        ["objdump", "-p", str(path)], capture_output=True, text=True, check=True
    ).stdout
    needed = re.findall(r"^\s+NEEDED\s+(\S+)$", out, re.MULTILINE)
    required: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        m = re.match(r"^\s+required from (\S+):$", line)
        if m:
            current = required.setdefault(m.group(1), [])
        elif current is not None and re.match(r"^\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)$", line):
            current.append(line.split()[-1])
        elif not line.strip():
            current = None
    return needed, required


def symbols_needing(path: Path, version: str) -> list[str]:
    out = subprocess.run(
        ["objdump", "-T", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return sorted(
        {
            line.split()[-1]
            for line in out.splitlines()
            if f"({version})" in line or f" {version} " in line
        }
    )


def check_elf_musl(native: Path) -> str:
    needed, required = elf_needs(native)
    if not set(needed) <= MUSL_LIBS or "libc.so" not in needed:
        fail(f"{native.name} links {needed}: a musllinux module links musl's libc.so only")
    versions = [v for vs in required.values() for v in vs]
    if versions:
        fail(f"{native.name} requires symbol versions {versions}: built against glibc?")
    return f"links {', '.join(needed)}; no glibc symbol versions"


def check_elf(native: Path, max_glibc: str) -> str:
    needed, required = elf_needs(native)
    extra = [lib for lib in needed if lib not in ALLOWED_LIBS]
    if extra:
        fail(f"{native.name} links {extra}: not on every manylinux system")
    if any(lib.startswith("libpython") for lib in needed):
        fail(f"{native.name} links libpython (an extension module must not)")
    glibc = sorted(
        {
            v
            for versions in required.values()
            for v in versions
            if v.startswith("GLIBC_") and re.fullmatch(r"GLIBC_[\d.]+", v)
        },
        key=lambda v: parse_version(v[6:]),
    )
    if not glibc:
        fail(f"{native.name} requires no GLIBC symbol version: not a glibc build?")
    newest = glibc[-1]
    if parse_version(newest[6:]) > parse_version(max_glibc):
        too_new = [v for v in glibc if parse_version(v[6:]) > parse_version(max_glibc)]
        culprits = {v: symbols_needing(native, v) for v in too_new}
        fail(f"{native.name} needs {newest} > GLIBC_{max_glibc}: {culprits}")
    cxx = [
        v for versions in required.values() for v in versions if v.startswith(("GLIBCXX", "CXXABI"))
    ]
    if cxx:
        fail(f"{native.name} needs the C++ runtime ({cxx})")
    return (
        f"links {', '.join(needed)}; newest symbol version {newest} "
        f"(<= GLIBC_{max_glibc}); glibc versions used: {', '.join(v[6:] for v in glibc)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--platform", required=True, help="e.g. manylinux_2_17_x86_64")
    parser.add_argument("--max-glibc", help="e.g. 2.17 (manylinux wheels)")
    parser.add_argument("--version", help="the version the wheel must carry")
    args = parser.parse_args()

    name = args.wheel.name
    m = re.fullmatch(r"protoprompt-([^-]+)-([^-]+)-([^-]+)-([^-]+)\.whl", name)
    if not m:
        fail(f"{name} is not a protoprompt wheel name")
    version, python_tag, abi_tag, platform_tags = m.groups()
    if args.version and version != args.version:
        fail(f"{name} has version {version}, expected {args.version}")
    if (python_tag, abi_tag) != ("cp310", "abi3"):
        fail(
            f"{name} is {python_tag}-{abi_tag}, expected cp310-abi3 (one wheel for CPython >= 3.10)"
        )
    if args.platform not in platform_tags.split("."):
        fail(f"{name} is tagged {platform_tags}, expected {args.platform}")

    with zipfile.ZipFile(args.wheel) as wheel:
        names = wheel.namelist()
        dist_info = f"protoprompt-{version}.dist-info"
        tags = wheel_tags(wheel, dist_info)
        expected = {f"cp310-abi3-{p}" for p in platform_tags.split(".")}
        if set(tags) != expected:
            fail(f"WHEEL tags {tags} do not match the file name ({sorted(expected)})")
        meta = wheel.read(f"{dist_info}/METADATA").decode()
        if f"\nVersion: {version}\n" not in meta:
            fail(f"METADATA does not say Version: {version}")
        if "Requires-Python: >=3.10" not in meta:
            fail("METADATA does not say Requires-Python: >=3.10")
        if f"{dist_info}/licenses/LICENSE" not in names:
            fail("the wheel carries no license file")
        for required in (
            "protoprompt/__init__.py",
            "protoprompt/py.typed",
            "protoprompt/_core.pyi",
        ):
            if required not in names:
                fail(f"the wheel lacks {required}")
        natives = [n for n in names if re.fullmatch(r"protoprompt/_core[^/]*\.(so|pyd)", n)]
        if len(natives) != 1:
            fail(f"expected one native module, found {natives}")
        elf_report = "not an ELF platform"
        if args.platform.startswith(("manylinux", "musllinux")):
            with tempfile.TemporaryDirectory() as tmp:
                native = Path(wheel.extract(natives[0], tmp))
                if args.platform.startswith("musllinux"):
                    elf_report = check_elf_musl(native)
                elif args.max_glibc:
                    elf_report = check_elf(native, args.max_glibc)
                else:
                    fail("a manylinux wheel is checked against --max-glibc")
    size = args.wheel.stat().st_size / 1e6
    print(f"{name}: ok ({size:.1f} MB; tags {', '.join(tags)}; {natives[0]}; {elf_report})")


if __name__ == "__main__":
    sys.exit(main())

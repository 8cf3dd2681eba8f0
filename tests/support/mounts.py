"""What the `rclone_mount` fixture needs to know about FUSE mounts here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def rclone_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "an rclone FUSE mount needs root here"
    missing = [name for name in ("rclone", "fusermount3") if shutil.which(name) is None]
    if missing:
        return f"missing {', '.join(missing)} (scripts/system-packages installs rclone and fuse3)"
    return None if Path("/dev/fuse").exists() else "no /dev/fuse"


def mounted(point: Path) -> bool:
    escaped = str(point).replace("\\", "\\134").replace(" ", "\\040")
    return any(line.split()[4] == escaped for line in Path("/proc/self/mountinfo").read_text().splitlines())

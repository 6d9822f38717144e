# Generated from lightning_hybrid/data/download.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Downloading files over HTTP(S) with progress, trying mirrors in turn."""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


class DownloadError(RuntimeError):
    """Every mirror failed for a file; the message lists each URL tried and why it failed."""


def download(name: str, mirrors: Sequence[str], dest: Path, timeout: float = 30.0) -> Path:
    """Download ``name`` from the first mirror that answers into ``dest / name``.

    Each mirror is a base URL to which ``name`` is appended. The file is written to a temporary
    name and renamed when complete, so an interrupted download never leaves a partial file behind.
    Progress is shown with a tqdm bar (stderr) and logged.
    """
    from tqdm.auto import tqdm

    dest.mkdir(parents=True, exist_ok=True)
    target = dest / name
    partial = dest / f".{name}.part"
    failures = []
    for base in mirrors:
        url = base.rstrip("/") + "/" + name
        log.info("downloading %s", url)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=name, leave=False) as bar:
                    for chunk in iter(lambda: response.read(1 << 16), b""):
                        out.write(chunk)
                        bar.update(len(chunk))
            os.replace(partial, target)
            return target
        except (urllib.error.URLError, OSError, ValueError) as err:
            failures.append(f"{url}: {getattr(err, 'reason', err)}")
            partial.unlink(missing_ok=True)
    raise DownloadError(f"could not download {name}:\n  " + "\n  ".join(failures))

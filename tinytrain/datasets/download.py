"""Downloads into the dataset cache: checksums, mirrors, atomic writes, a clear offline error."""
import hashlib
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO, Sequence

from tinytrain.serialization import atomic_write

_CHUNK = 1 << 20

class ChecksumError(ValueError):
    """A file's digest differs from the published one."""

    def __init__(self, what: str, algorithm: str, expected: str, actual: str, hint: str = "") -> None:
        message = f"{algorithm.upper()} checksum mismatch for {what}: expected {expected}, got {actual}"
        super().__init__(message + (f"; {hint}" if hint else ""))
        self.what = what
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual

class DownloadError(OSError):
    """No URL of a file could be downloaded (offline, or every server failed)."""

def data_dir() -> Path:
    """The cache directory: ``$TINYTRAIN_DATA``, else ``<user cache dir>/tinytrain``."""
    configured = os.environ.get("TINYTRAIN_DATA")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "tinytrain"

def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in chunks."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()

def verify(path: Path, algorithm: str, expected: str) -> None:
    actual = file_digest(path, algorithm)
    if actual != expected:
        raise ChecksumError(
            str(path), algorithm, expected, actual, hint="the file is corrupt or not the published one; delete it"
        )

def download_file(urls: Sequence[str], path: str | os.PathLike, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``path`` from the first of ``urls`` that serves the right bytes.

    The file is streamed into a temporary file in the target folder while its
    SHA-256 is computed, fsynced, checked against ``sha256`` and only then
    renamed to ``path`` (an atomic step): an interrupted or mismatching download
    never leaves a file at ``path``. A URL that fails or serves other bytes is
    followed by the next one (the mirrors). Raises :class:`ChecksumError` (naming
    the expected and actual digests) when some URL answered but no URL served
    the right bytes, :class:`DownloadError` (naming every URL tried and what
    went wrong) when none answered.
    """
    import urllib.request

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    mismatches: list[ChecksumError] = []
    for url in urls:
        print(f"tinytrain: downloading {url}", file=sys.stderr)
        try:
            _fetch(urllib.request, url, path, sha256, timeout)
        except ChecksumError as error:
            mismatches.append(error)
        except _Unreachable as error:
            failures.append(f"  {url}: {error.__cause__}")
        except OSError as error:  # this machine's fault (a read-only or full disk): no mirror helps
            raise OSError(error.errno, f"cannot save {path}: {error.strerror or error}; set TINYTRAIN_DATA to a "
                                       "writable folder, or pass root= a folder that holds the dataset's files") from error
        else:
            return path
    if mismatches:
        actual = ", ".join(f"{error.actual} (from {error.what})" for error in mismatches)
        raise ChecksumError(
            path.name, "sha256", sha256, actual, hint="nothing was saved; the server may be serving a different file"
        )
    raise DownloadError(
        f"could not download {path.name}; tried:\n" + "\n".join(failures) + "\n"
        "Are you offline? Download the file on a machine with network access and either put it in "
        f"{path.parent} or pass root= a folder that holds the dataset's files (e.g. MNIST(root='path/to/folder'))."
    )

class _Unreachable(Exception):
    """A URL failed to serve its file (its ``__cause__`` says how): the next mirror may not."""

def _network(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` with its failures raised as :class:`_Unreachable`, so that they are
    told apart from errors in writing the file (both are ``OSError``: URLError and timeouts too)."""
    import http.client

    try:
        return call(*args, **kwargs)
    except (OSError, http.client.HTTPException) as error:
        raise _Unreachable from error

def _fetch(urllib_request: Any, url: str, path: Path, sha256: str, timeout: float) -> None:
    """One attempt: ``url`` into ``path``, renamed into place only if its SHA-256 matches."""

    def stream_and_verify(out: BinaryIO) -> None:
        digest = hashlib.sha256()
        request = urllib_request.Request(url, headers={"User-Agent": "tinytrain"})
        with _network(urllib_request.urlopen, request, timeout=timeout) as response:
            for chunk in iter(lambda: _network(response.read, _CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:  # raising here makes atomic_write discard the file
            raise ChecksumError(url, "sha256", sha256, digest.hexdigest())

    atomic_write(path, stream_and_verify)

"""Text shipped with the package: ``shakespeare()``, the Tiny Shakespeare corpus."""
import gzip
import hashlib
from importlib import resources

from tinytrain.datasets.download import ChecksumError

# SHA-256 of the text (the UTF-8 bytes of karpathy/char-rnn's input.txt), checked after decompressing.
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def shakespeare() -> str:
    """Tiny Shakespeare: 1,115,394 characters (40,000 lines) of Shakespeare's plays, 65 different characters.

    The standard small corpus for character-level language models (``data/tinyshakespeare/input.txt``
    of the GitHub repository karpathy/char-rnn, 2015; public domain). It ships inside the
    package, gzip-compressed (``tinytrain/datasets/files/tinyshakespeare.txt.gz``, provenance in
    ``files/README.md``), so no network is needed; the text's SHA-256 is checked on every call
    (``ChecksumError`` when it differs).
    """
    compressed = (resources.files(__package__) / "files" / "tinyshakespeare.txt.gz").read_bytes()
    data = gzip.decompress(compressed)
    actual = hashlib.sha256(data).hexdigest()
    if actual != SHAKESPEARE_SHA256:
        raise ChecksumError("the text of tinytrain/datasets/files/tinyshakespeare.txt.gz", "sha256",
                            SHAKESPEARE_SHA256, actual, hint="reinstall tinytrain")
    return data.decode("utf-8")

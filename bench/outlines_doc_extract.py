"""Python examples out of outlines' documentation pages (markdown), and which of them can run here.

Used by ``bench/outlines_doc_examples.py``; kept free of outlines, torch and the model so the
test (``tests/compat/test_outlines_doc_examples.py``) can check it on a small in-repo sample.

A page is read like a notebook: its Python code blocks run in order in one namespace, so a block
may use what an earlier block of the same page defined. Each block is classified *statically*:

* not Python (``bash``, output listings, text that does not parse): not an example at all;
* another inference provider (OpenAI, vLLM, llama.cpp, MLX, API clients...), or a model that an
  earlier block built with one: skipped, with the provider as reason;
* something this machine cannot do (GPU-only code, network downloads, servers, deployment
  platforms, images/PDFs, logins): skipped, with the reason;
* names the page never defines (a fragment: ``generator(prompt)`` with no ``prompt``): skipped,
  except ``model``, which the runner supplies (the embedded model) when a page uses one it never
  built ("assume a model").

What is left is run; whether it counts as an *example* (it generated, or it raised) is decided at
run time by the runner.
"""
from __future__ import annotations

import ast
import builtins
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_LANGS = {"python", "py", "python3", "pycon"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")

# another inference provider in the block's code: (pattern, name)
PROVIDERS: list[tuple[re.Pattern, str]] = [(re.compile(p), name) for p, name in [
    (r"models\.openai|from_openai|openai\.|OpenAI\(|AzureOpenAI|import openai|from openai", "OpenAI"),
    (r"models\.vllm|from_vllm|VLLM|vllm\.|import vllm|from vllm", "vLLM"),
    (r"models\.llamacpp|from_llamacpp|llama_cpp|LlamaCpp|llamacpp", "llama.cpp"),
    (r"models\.mlxlm|from_mlxlm|mlx_lm|mlx\.", "MLX"),
    (r"models\.exl2|exllamav2|from_exllama", "ExLlamaV2"),
    (r"anthropic|Anthropic", "Anthropic"),
    (r"gemini|genai\.|from google", "Gemini"),
    (r"from_ollama|ollama", "Ollama"),
    (r"from_sglang|sglang", "SGLang"),
    (r"from_tgi|huggingface_hub\.InferenceClient|InferenceClient|AsyncInferenceClient|\btgi\b", "TGI"),
    (r"from_dottxt|dottxt", "dottxt"),
    (r"from_mistral|mistralai\.|from mistralai|Mistral\(", "Mistral API"),
    (r"lmstudio|from_lmstudio", "LM Studio"),
    (r"TransformersVision|transformers_vision|from_transformers\([^)]*Processor|AutoProcessor|"
     r"LlavaForConditionalGeneration|Qwen2VL|ForConditionalGeneration|outlines\.inputs\.Image|\bImage\(", "vision/multimodal"),
    (r"models\.mamba|MambaForCausalLM", "mamba"),
]]
# things this machine cannot do
MACHINE: list[tuple[re.Pattern, str]] = [(re.compile(p), why) for p, why in [
    (r"huggingface_hub import login|\blogin\(\)", "Hugging Face login (network)"),
    (r"import modal|from modal|@app\.|modal\.", "Modal deployment"),
    (r"import bentoml|bentoml\.", "BentoML deployment"),
    (r"cerebrium", "Cerebrium deployment"),
    (r"beam\.|from beam", "Beam deployment"),
    (r"requests\.(get|post)|urllib|httpx|urlopen|wikipedia|from_github", "network access"),
    (r"FastAPI|uvicorn|fastapi", "a web server"),
    (r"pdf2image|convert_from_path|fitz|PyPDF|pypdf", "PDF processing"),
    (r"PIL|Image\.open|load_image", "images"),
    (r"load_dataset|datasets import", "Hugging Face datasets (network)"),
    (r"\.cuda\(\)|device_map=\"cuda\"|device=\"cuda:\d", "a CUDA GPU"),
    (r"chess\.", "the python-chess package"),
    (r"\bsubprocess\b|os\.system", "shell commands"),
    (r"\.from_file\(|\bopen\(", "a file the page does not include"),
]]
# a block that builds a model: (pattern, provider or None for transformers)
TRANSFORMERS_MODEL = re.compile(r"models\.transformers\(|from_transformers\(|models\.Transformers\(|"
                                r"outlines\.Transformers\(")

# names the runner supplies when a page uses them without defining them ("assume a model")
ASSUMED = {"model", "outlines"}


@dataclass
class Block:
    """One fenced Python code block of a page (dedented, admonition indentation removed)."""

    page: str
    index: int          # position among the page's Python blocks
    line: int           # 1-based line of the opening fence
    code: str
    status: str = "run"  # "run", "skipped", "not-python"
    reason: str = ""
    free_names: list[str] = field(default_factory=list)
    expected_error: str | None = None  # the exception the page shows this block raising
    assumes: list[str] = field(default_factory=list)  # ASSUMED names it reads without defining

    @property
    def ident(self) -> str:
        return f"{self.page}#{self.index}@L{self.line}"


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` for every fenced block; fences may be indented (mkdocs tabs and
    admonitions) and the block's lines lose that indentation."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), m.group("indent")
        info = m.group("info").strip()
        lang = re.split(r"[\s{]", info.strip("{}. "), maxsplit=1)[0].lower() if info else ""
        body, j = [], i + 1
        while j < len(lines):
            close = FENCE.match(lines[j])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
                    and not close.group("info").strip():
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        out.append((i + 1, lang, textwrap.dedent("\n".join(body))))
        i = j + 1
    return out


# IPython magics / shell escapes (not Lark's ``%import`` / ``%ignore`` inside a grammar string)
MAGIC = re.compile(r"^\s*(%(pip|conda|load_ext|matplotlib|env|cd|time|timeit)\b|%%\w|!(pip|conda|wget|curl|git|apt|python)\b)")


def _from_console(code: str) -> str:
    """``>>> x`` / ``... y`` transcripts: keep the code lines, drop the printed output. Notebook
    magics (``%pip install ...``, ``!pip ...``) are dropped too (installing is not an example)."""
    code = "\n".join(line for line in code.splitlines() if not MAGIC.match(line))
    if not any(line.startswith(">>>") for line in code.splitlines()):
        return code
    kept = []
    for line in code.splitlines():
        if line.startswith(">>> ") or line == ">>>":
            kept.append(line[4:])
        elif line.startswith("... ") or line == "...":
            kept.append(line[4:])
    return "\n".join(kept)


TRACEBACK_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Warning))\b", re.M)


def documented_error(output: str) -> str | None:
    """The exception class an output listing shows (``Traceback ...`` then ``XError: ...``)."""
    if "Traceback (most recent call last)" not in output:
        return None
    names = TRACEBACK_ERROR.findall(output.split("Traceback (most recent call last)", 1)[1])
    return names[-1] if names else None


SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.M)


def include_snippets(code: str, root: Path | None, page: str) -> str:
    """mkdocs' ``--8<-- "path"`` lines replaced by that file of the sdist (by the page's own
    folder's file of that name when the stated path is not in it); left as is when absent."""
    if root is None:
        return code

    def replace(m: re.Match) -> str:
        for candidate in (root / m.group(1), (root / page).parent / Path(m.group(1)).name):
            if candidate.is_file():
                return candidate.read_text(encoding="utf-8", errors="replace")
        return m.group(0)

    return SNIPPET.sub(replace, code)


def page_blocks(page: str, text: str, root: Path | None = None) -> list[Block]:
    """The page's Python blocks, in order; a block whose next listing is a traceback documents
    that exception (``expected_error``); ``root``: the sdist, for mkdocs snippet includes."""
    blocks = []
    fenced = [(line, lang, include_snippets(code, root, page)) for line, lang, code in fenced_blocks(text)]
    for k, (line, lang, code) in enumerate(fenced):
        if lang not in PYTHON_LANGS:
            continue
        block = Block(page, len(blocks), line, _from_console(code))
        if k + 1 < len(fenced) and fenced[k + 1][1] not in PYTHON_LANGS:
            block.expected_error = documented_error(fenced[k + 1][2])
        blocks.append(block)
    return blocks


def _module_level(tree: ast.Module) -> set[str]:
    """Names a block binds in its own namespace (not a function's parameters or locals)."""
    out: set[str] = set()

    def visit(stmts):
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
                continue
            nested = [getattr(node, f, None) for f in ("body", "orelse", "finalbody")]
            nested += [h.body for h in getattr(node, "handlers", [])]
            nested = [n for n in nested if isinstance(n, list)]
            own = [node] if not nested else [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt)]
            for part in own:  # the statement itself, or a compound statement's header (for-target, with-as)
                for child in ast.walk(part):
                    if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                        out.add(child.id)
            for stmts in nested:
                visit(stmts)

    visit(tree.body)
    return out


def _defined_and_loaded(tree: ast.AST) -> tuple[set[str], list[str]]:
    """Names a block binds at any level, and names it reads that it does not bind itself."""
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            args = node.args if not isinstance(node, ast.ClassDef) else None
            if args is not None:
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if a is not None:
                        defined.add(a.arg)
        elif isinstance(node, ast.Lambda):
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg,
                      node.args.kwarg]:
                if a is not None:
                    defined.add(a.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                defined.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            defined.update(node.names)
        elif isinstance(node, ast.MatchAs) and node.name:
            defined.add(node.name)
    # ``Action: Action`` in a class body reads the outer ``Action`` before binding its own
    class_only = {t.id for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for st in c.body
                  for t in ([st.target] if isinstance(st, ast.AnnAssign) else getattr(st, "targets", []))
                  if isinstance(t, ast.Name)}
    params = {a.arg for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
              for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs, f.args.vararg, f.args.kwarg]
              if a is not None}
    defined -= class_only - params - _module_level(tree) if isinstance(tree, ast.Module) else set()
    loaded = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in defined \
                and node.id not in loaded:
            loaded.append(node.id)
    return defined, loaded


def _missing_packages(tree: ast.AST) -> list[str]:
    """Top-level packages the block imports that this environment does not have (outlines and
    transformers are never missing: the runner provides them)."""
    import importlib.util

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in dict.fromkeys(names) if n != "outlines" and importlib.util.find_spec(n) is None]


def classify(blocks: list[Block]) -> list[Block]:
    """Mark each block of one page as run / skipped (with reason) / not Python (see module doc)."""
    known: set[str] = set(dir(builtins)) | {"__name__", "__file__", "display"}
    skipped_defs: set[str] = set()
    provider: str | None = None  # provider of the model the page built last (None: transformers or none)
    for block in blocks:
        try:
            tree = ast.parse(block.code)
        except SyntaxError as exc:
            block.status, block.reason = "not-python", f"does not parse ({exc.msg}, line {exc.lineno})"
            continue
        code = block.code
        found = next((name for pat, name in PROVIDERS if pat.search(code)), None)
        if found is not None:
            provider = found
        elif TRANSFORMERS_MODEL.search(code):
            provider = None
        _, loaded = _defined_and_loaded(tree)
        defined = _module_level(tree)
        if found is not None:
            block.status, block.reason = "skipped", f"another provider: {found}"
        elif provider is not None and not TRANSFORMERS_MODEL.search(code) and "model" in loaded:
            block.status, block.reason = "skipped", f"uses the {provider} model of an earlier block"
        else:
            why = next((why for pat, why in MACHINE if pat.search(code)), None)
            if why is not None:
                block.status, block.reason = "skipped", f"needs {why}"
            elif any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is Ellipsis
                     for n in tree.body):
                block.status, block.reason = "skipped", "fragment: placeholder values (`x = ...`)"
            elif any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)):
                block.status, block.reason = "skipped", "fragment: a module of the reader's own package (relative import)"
        free = [n for n in loaded if n not in known and n not in ASSUMED]
        block.free_names = free
        block.assumes = [n for n in loaded if n in ASSUMED]
        if block.status == "run":
            missing = _missing_packages(tree)
            if missing:
                block.status, block.reason = "skipped", f"needs the {', '.join(missing)} package (not installed here)"
        if block.status == "run" and free:
            from_skipped = [n for n in free if n in skipped_defs]
            block.status, block.reason = "skipped", (
                f"needs names only a skipped block defines: {', '.join(from_skipped[:5])}" if from_skipped
                else "fragment: uses names the page never defines: " + ", ".join(free[:5]))
        if block.status == "run":
            known |= defined
        else:  # what a skipped block defines is missing to later blocks
            skipped_defs |= defined
    return blocks


def page_sources(src: Path) -> list[Path]:
    """README and every documentation page of an extracted sdist, in a stable order."""
    pages = [src / "README.md"] if (src / "README.md").is_file() else []
    docs = src / "docs"
    if docs.is_dir():
        pages += sorted(p for p in docs.rglob("*.md")
                        if not re.search(r"community/|/blog/|api(_reference)?/|licen[cs]e", str(p.relative_to(src))))
    return pages


def extract(src: Path) -> dict[str, list[Block]]:
    """``{page: classified blocks}`` of every page that has Python blocks."""
    out = {}
    for path in page_sources(src):
        rel = str(path.relative_to(src))
        blocks = page_blocks(rel, path.read_text(encoding="utf-8", errors="replace"), src)
        if blocks:
            out[rel] = classify(blocks)
    return out

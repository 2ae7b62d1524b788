"""The web UI, server-side tools and MCP; upstream's twelve model presets;
--log-prompts-dir.

* The web UI: --ui / --no-ui (default on) serves the built-in page at /,
  and --ui-config / --ui-config-file give its default settings, reported in
  /props as ui_settings (checked as JSON at startup, cli/main.py).
  --path would replace the page with a directory of files; it is refused.
* Tools/MCP: mlxcel-trio executes nothing on a model's behalf, so only the
  forms asking for that state (--no-agent, --no-ui-mcp-proxy, an empty
  --path) are inert; the rest is not_applicable and hidden.
* Presets fetch a GGUF build and rewrite the serving options; each is refused
  naming the MLX checkpoint closest to it.  Those names appear in this
  diagnostic only and are never resolved on the operator's behalf.
* --log-prompts-dir would put request bodies on disk; it is refused.
"""

from __future__ import annotations

from typing import Any

from mlxcel_trio.cli.record import Option
from mlxcel_trio.cli.refusals import NO_NGRAM_MOD, NO_TOOLS, equals, not_applicable
from mlxcel_trio.cli.values import Text

CLIENT_TOOLS = "run tools in the client; the server never executes them"


NO_STATIC_PATH = ("mlxcel-trio serves its own built-in web UI and no directory of "
                  "static files")


def _ui(spellings: tuple[str, ...], dest: str, help: str, **kw: Any) -> Option:
    kw.setdefault("why", NO_TOOLS)
    kw.setdefault("section", "server")
    return not_applicable(spellings, dest, help, **kw)


UI: tuple[Option, ...] = (
    _ui(("--path",), "static_path", "directory of static files to serve",
        value=Text(allow_empty=True), metavar="PATH", default="", default_text="",
        env="LLAMA_ARG_STATIC_PATH", inert=equals(""), accepts='""', why=NO_STATIC_PATH,
        instead="use the built-in UI at / (--ui), or serve the files from another "
                "web server in front of this one"),
    Option(("--ui-config", "--webui-config"), "ui_config",
           "JSON that provides default UI settings (overrides UI defaults)",
           value=Text(), metavar="JSON", env="LLAMA_ARG_UI_CONFIG", section="server", owner=20),
    Option(("--ui-config-file", "--webui-config-file"), "ui_config_file",
           "JSON file that provides default UI settings (overrides UI defaults)",
           value=Text(), metavar="PATH", env="LLAMA_ARG_UI_CONFIG_FILE", section="server",
           owner=20),
    _ui(("--ui-mcp-proxy", "--webui-mcp-proxy"), "ui_mcp_proxy",
        "open the MCP CORS proxy for the web UI", kind="bool",
        negations=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), default=False,
        env="LLAMA_ARG_UI_MCP_PROXY", inert=equals(False), accepts="--no-ui-mcp-proxy",
        instead="omit the option (--no-ui-mcp-proxy is accepted)"),
    _ui(("--tools",), "tools", "built-in tools the server runs for agents",
        value=Text(), metavar="TOOL1,TOOL2,...", default_text="no tools",
        env="LLAMA_ARG_TOOLS", instead=CLIENT_TOOLS),
    _ui(("--tools-runtime",), "tools_runtime", "where server-side tools run",
        value=Text(), metavar="OPTION", default_text="none, use host environment",
        env="LLAMA_ARG_TOOLS_RUNTIME", instead=CLIENT_TOOLS),
    _ui(("--mcp-servers-config",), "mcp_servers_config",
        "MCP server definitions from a JSON file", value=Text(), metavar="PATH",
        default_text="none", env="LLAMA_ARG_MCP_SERVERS_CONFIG", instead=CLIENT_TOOLS),
    _ui(("--mcp-servers-json",), "mcp_servers_json", "MCP server definitions (JSON)",
        value=Text(), metavar="JSON", default_text="none",
        env="LLAMA_ARG_MCP_SERVERS_JSON", instead=CLIENT_TOOLS),
    _ui(("-ag", "--agent"), "agent", "turn on the MCP proxy and every built-in tool",
        kind="bool", negations=("-no-ag", "--no-agent"), default=False,
        env="LLAMA_ARG_AGENT", inert=equals(False), accepts="--no-agent",
        instead="omit the option (--no-agent is accepted)"),
    Option(("--ui", "--webui"), "ui", "whether to enable the Web UI", kind="bool",
           negations=("--no-ui", "--no-webui"), default=True, env="LLAMA_ARG_UI",
           section="server", status="by_design", owner=20),
)

# upstream preset -> the MLX checkpoint closest to it (None: nothing to name)
PRESETS: dict[str, str | None] = {
    "--embd-gemma-default": "mlx-community/embeddinggemma-300m-4bit",
    "--fim-qwen-1.5b-default": "mlx-community/Qwen2.5-Coder-1.5B-8bit",
    "--fim-qwen-3b-default": "mlx-community/Qwen2.5-Coder-3B-8bit",
    "--fim-qwen-7b-default": "mlx-community/Qwen2.5-Coder-7B-8bit",
    "--fim-qwen-7b-spec": "mlx-community/Qwen2.5-Coder-7B-8bit",
    "--fim-qwen-14b-spec": "mlx-community/Qwen2.5-Coder-14B-8bit",
    "--fim-qwen-30b-default": "mlx-community/Qwen3-Coder-30B-A3B-Instruct-8bit",
    "--gpt-oss-20b-default": "mlx-community/gpt-oss-20b-MXFP4-Q8",
    "--gpt-oss-120b-default": "mlx-community/gpt-oss-120b-MXFP4-Q8",
    "--vision-gemma-4b-default": "mlx-community/gemma-3-4b-it-qat-4bit",
    "--vision-gemma-12b-default": "mlx-community/gemma-3-12b-it-qat-4bit",
    "--spec-default": None,
}

_PRESET_HELP = {
    "--embd-gemma-default": "preset: EmbeddingGemma 300M",
    "--fim-qwen-1.5b-default": "preset: Qwen 2.5 Coder 1.5B for fill-in-the-middle",
    "--fim-qwen-3b-default": "preset: Qwen 2.5 Coder 3B for fill-in-the-middle",
    "--fim-qwen-7b-default": "preset: Qwen 2.5 Coder 7B for fill-in-the-middle",
    "--fim-qwen-7b-spec": "preset: Qwen 2.5 Coder 7B with a 0.5B draft model",
    "--fim-qwen-14b-spec": "preset: Qwen 2.5 Coder 14B with a 0.5B draft model",
    "--fim-qwen-30b-default": "preset: Qwen 3 Coder 30B A3B Instruct",
    "--gpt-oss-20b-default": "preset: gpt-oss 20B",
    "--gpt-oss-120b-default": "preset: gpt-oss 120B",
    "--vision-gemma-4b-default": "preset: Gemma 3 4B QAT (vision)",
    "--vision-gemma-12b-default": "preset: Gemma 3 12B QAT (vision)",
    "--spec-default": "preset: default speculative decoding settings",
}

PRESET_WHY = ("presets download a GGUF build and rewrite the serving options; "
              "mlxcel-trio serves MLX checkpoints and applies no presets")


def _preset(flag: str, repo: str | None) -> Option:
    if repo is None:
        why = f"it turns on ngram-mod speculative decoding, and {NO_NGRAM_MOD}"
        instead = "use --spec-type ngram-simple"
    else:
        why = PRESET_WHY
        instead = f"use --model {repo} and set the other options yourself"
        if flag.endswith("-spec"):
            instead += " (and the draft with -md <mlx checkpoint>)"
    dest = "preset_" + flag.removeprefix("--").replace("-", "_").replace(".", "_")
    return not_applicable((flag,), dest, _PRESET_HELP[flag], kind="flag", why=why,
                          instead=instead, section="server")


MISC: tuple[Option, ...] = (
    *(_preset(flag, repo) for flag, repo in PRESETS.items()),
    not_applicable(("--log-prompts-dir",), "log_prompts_dir",
                   "write every request prompt to files in this directory",
                   value=Text(), metavar="PATH", section="server",
                   why="mlxcel-trio never writes request prompts to disk",
                   instead="use --log-file with --verbosity 4 (or -v/--verbose) for "
                           "request-level logging: route and status, never a prompt"),
)

"""``gpushare extender``: serve the scheduler extender with uvicorn.

Today the state is in memory: nodes come from ``--nodes FILE`` (a NodeList or a list of Node
objects, as ``kubectl get nodes -o json`` prints) and from ``Nodes`` requests
(``nodeCacheCapable: false``); nothing can bind (``UnwiredBinder``). The seam for the API
server is ``build_state``: ``gpushare.kube`` will feed the same ``ExtenderState`` from its
list+watch caches and pass its binder and event sink to ``create_app``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import uvicorn

from gpushare.core.policies import policy_names
from gpushare.extender import DEFAULT_PORT, DEFAULT_PREFIX, ExtenderState, create_app
from gpushare.kube.codec import CodecError


def build_state(nodes_file: Path | None, assume_ttl_s: float) -> ExtenderState:
    """An in-memory state, synced, with the nodes of ``nodes_file`` (``ClickException`` naming
    the file and the problem when it cannot be read)."""
    state = ExtenderState(assume_ttl_s=assume_ttl_s)
    if nodes_file is not None:
        try:
            document = json.loads(nodes_file.read_text(encoding="utf-8"))
            items = document.get("items") if isinstance(document, dict) else document
            if not isinstance(items, list):
                raise ValueError("expected a NodeList or a JSON list of Node objects")
            for item in items:
                if not isinstance(item, dict):
                    raise ValueError(f"not a Node object: {item!r:.80}")
                state.upsert_node(item)
        except (OSError, ValueError, CodecError) as error:
            raise click.ClickException(f"--nodes {nodes_file}: {error}") from error
    state.mark_synced()
    return state


@click.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--prefix", default=DEFAULT_PREFIX, show_default=True, help="URL prefix of the verbs."
)
@click.option(
    "--policy",
    type=click.Choice(policy_names()),
    default="binpack",
    show_default=True,
    help="Placement policy: node half for prioritize, GPU half for bind.",
)
@click.option(
    "--gpu-unit",
    type=click.IntRange(min=4),
    default=16,
    show_default=True,
    help="One whole GPU in the nodes' memory unit (fgd, fgd-cpu).",
)
@click.option(
    "--assume-ttl",
    "assume_ttl_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds an assumed allocation lives unless the pod is seen bound.",
)
@click.option(
    "--nodes",
    "nodes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON NodeList to preload (in-memory state).",
)
@click.option("--log-level", default="info", show_default=True)
def extender(
    *,
    host: str,
    port: int,
    prefix: str,
    policy: str,
    gpu_unit: int,
    assume_ttl_s: float,
    nodes_file: Path | None,
    log_level: str,
) -> None:
    """Serve the scheduler extender (filter, prioritize, bind, inspect) for kube-scheduler."""
    state = build_state(nodes_file, assume_ttl_s)
    app = create_app(state, prefix=prefix, policy=policy, gpu_unit=gpu_unit)
    uvicorn.run(app, host=host, port=port, log_level=log_level)

"""Files `connector-push dev` derives from `temporal-dev.yaml`, so ports have one home.

The demo pack's `baseUrl` (the sandbox remote) and the demo ingress policy's
`public_base_url` (the ingress) and `callback_base_url` (the sandbox) are
rewritten from the config into copies in the data directory; the examples keep
their values only as readable defaults.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cli.stack.devconfig import DevConfig, ServiceDevConfig


def service_url(service: ServiceDevConfig) -> str:
    return f"http://{service.host}:{service.port}"


def replace_keys(node: object, urls: dict[str, str]) -> object:
    """`node` with the value of every mapping key in `urls` replaced, at any depth."""
    if isinstance(node, dict):
        return {k: urls.get(k, replace_keys(v, urls)) for k, v in node.items()}
    if isinstance(node, list):
        return [replace_keys(item, urls) for item in node]
    return node


def derive_file(source: Path, target: Path, urls: dict[str, str]) -> Path:
    """`source` with every key in `urls` set to its URL, written to `target`."""
    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(replace_keys(document, urls), sort_keys=False), "utf-8")
    return target


def ingress_policy_file(config: DevConfig) -> Path:
    """The demo ingress policy with the configured ingress and sandbox URLs."""
    return derive_file(
        config.resolve("examples/ingress.yaml"),
        config.resolve(config.data_dir) / "ingress.yaml",
        {
            "public_base_url": service_url(config.ingress),
            "callback_base_url": service_url(config.sandbox),
        },
    )

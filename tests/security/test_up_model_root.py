"""`tessera up`'s agents load under one model root (issue 31): by default the folder holding
the manifest's model and every variant; a later edit naming a folder outside it is refused
with the reason instead of failing on the agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera import api
from tessera.cli import up_cmd


def _dep(model: Path, variants: list[dict[str, str]]) -> Any:
    return api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "tiny"},
            "spec": {"model": {"name": "m", "path": str(model)}, "variants": variants},
        }
    )


def test_the_default_root_holds_the_model_and_its_variants(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    alone = _dep(model, [])
    assert up_cmd._model_root(alone, str(model)) == str(model.resolve())
    lora = _dep(model, [{"name": "legal", "adapter": str(tmp_path / "adapters" / "legal")}])
    assert up_cmd._model_root(lora, str(model)) == str(tmp_path.resolve())
    relative = _dep(model, [{"name": "code", "adapter": "code"}])  # beside the model
    assert up_cmd._model_root(relative, str(model)) == str((tmp_path / "models").resolve())


def test_an_edit_outside_the_root_is_named(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    root = str(model.parent.resolve())
    inside = _dep(model, [{"name": "code", "adapter": "code"}])
    assert up_cmd._outside_root(inside, str(model), root) == []
    outside = _dep(model, [{"name": "x", "adapter": "/etc"}])
    (problem,) = up_cmd._outside_root(outside, str(model), root)
    assert problem.startswith("spec.variants[0]: /etc is outside the agents' model root")

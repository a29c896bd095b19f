"""Every KubeRay manifest agrees with the recipes it serves: GPUs, node groups, markers, secret, volumes; the
Slurm script is valid bash and marks nodes as `plan` lays them out."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo_ray import placement
from grpo_ray.config import SECRET_KEY, load_recipe
from grpo_ray.placement import node_markers
from tests.conftest import ROOT

MANIFESTS = sorted((ROOT / "deploy" / "kuberay").glob("*.yaml"))
ACCELERATOR = {"b200": "nvidia-b200", "h200": "nvidia-h200-141gb"}


def cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def marker_of(group: dict) -> str | None:
    raw = group["rayStartParams"].get("resources")
    if raw is None:
        return None
    value = json.loads(raw)  # KubeRay's form: a JSON string holding the JSON object
    value = json.loads(value) if isinstance(value, str) else value
    assert list(value.values()) == [1], value
    return next(iter(value))


def containers(template: dict) -> list[dict]:
    return template["spec"]["containers"]


def test_there_are_manifests_for_every_multi_node_recipe():
    served = {
        r
        for m in MANIFESTS
        for r in yaml.safe_load(m.read_text())["metadata"]["annotations"]["grpo-ray/recipes"].split(",")
    }
    scale = {f"recipes/{p.name}" for p in (ROOT / "recipes").glob("*.yaml") if not p.name.startswith("tiny-")}
    one_gpu = {r for r in scale if load_recipe(ROOT / r).cluster.devices_per_node == 1}  # a workstation's
    assert len(one_gpu) == 3 and served == scale - one_gpu
    assert any(yaml.safe_load(m.read_text())["kind"] == "RayJob" for m in MANIFESTS)


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_its_recipes(manifest: Path):
    doc = yaml.safe_load(manifest.read_text())
    spec = cluster_spec(doc)
    workers = spec["workerGroupSpecs"]
    overrides = doc["metadata"]["annotations"].get("grpo-ray/overrides", "").split()
    for recipe_path in doc["metadata"]["annotations"]["grpo-ray/recipes"].split(","):
        r = load_recipe(ROOT / recipe_path, overrides)
        c = r.cluster
        # the GPU nodes: as many as the recipe's cluster, each with its devices, on the recipe's GPU model
        assert sum(g["replicas"] for g in workers) == c.nodes, recipe_path
        for g in workers:
            assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
            if g["minReplicas"] < g["maxReplicas"]:  # elastic engines: the generation group's range is theirs
                per_node = c.devices_per_node // r.generator.tensor_parallel_size
                assert spec["enableInTreeAutoscaling"] is True and marker_of(g) == c.node_resources["generator"]
                assert (g["minReplicas"] * per_node, g["maxReplicas"] * per_node) == (
                    r.generator.num_engines,
                    r.generator.max_engines,
                ), recipe_path
            limits = containers(g["template"])[0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) == int(g["rayStartParams"]["num-gpus"]) == c.devices_per_node
            assert g["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator"] == ACCELERATOR[c.gpu]
            assert any(t["key"] == "nvidia.com/gpu" for t in g["template"]["spec"]["tolerations"])
        # node groups: one worker group per marker, with the recipe's count of nodes
        markers = {marker_of(g): g["replicas"] for g in workers if marker_of(g)}
        assert markers == dict(c.node_markers), recipe_path
        assert set(c.node_resources.values()) <= set(markers), "a pool asks for a marker no worker group carries"
        # shared storage: data and outputs live under the mounted volume on every pod
        for template in [spec["headGroupSpec"]["template"]] + [g["template"] for g in workers]:
            mounts = {m["mountPath"]: m["name"] for m in containers(template)[0]["volumeMounts"]}
            shared = [p for p in mounts if r.trainer.output_dir.startswith(p + "/")]
            assert shared, f"{r.trainer.output_dir} is not on a mounted volume"
            for f in r.data.train_files + r.data.val_files:
                assert f.startswith(shared[0] + "/"), f
            volumes = {v["name"]: v for v in template["spec"]["volumes"]}
            assert "persistentVolumeClaim" in volumes[mounts[shared[0]]]
            env = {e["name"]: e for e in containers(template)[0]["env"]}
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token" and "value" not in env["HF_TOKEN"]
            for key in (
                "WANDB_API_KEY",
                "MLFLOW_TRACKING_TOKEN",
            ):  # the trackers' keys: a secret, optional, never inline
                ref = env[key]["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "tracker-keys" and ref["optional"] is True and "value" not in env[key]
            assert env["HF_HOME"]["value"].startswith(shared[0] + "/")
            # Ray 2.60 token auth: every pod runs in token mode with the token from a secret, never inline
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "ray-auth-token"
            assert "value" not in env["RAY_AUTH_TOKEN"]
        for g in workers:
            volumes = {v["name"]: v for v in g["template"]["spec"]["volumes"]}
            shm = [m for m in containers(g["template"])[0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
            assert shm and volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"


def test_rayjob_resubmits_and_resumes_with_the_runtime_env_of_its_gpu():
    for manifest in MANIFESTS:
        doc = yaml.safe_load(manifest.read_text())
        if doc["kind"] != "RayJob":
            continue
        spec = doc["spec"]
        recipe_path = doc["metadata"]["annotations"]["grpo-ray/recipes"]
        r = load_recipe(ROOT / recipe_path)
        assert spec["backoffLimit"] >= 1 and spec["shutdownAfterJobFinishes"] is True
        assert spec["entrypoint"].startswith(f"grpo-ray train /app/{recipe_path}")
        assert "resume=disable" not in spec["entrypoint"] and r.trainer.resume == "auto" and r.trainer.save_freq > 0
        shipped = yaml.safe_load((ROOT / "runtime_env" / f"gke-{r.cluster.gpu}.yaml").read_text())["env_vars"]
        assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"] == shipped


def test_runtime_envs_carry_no_secret_and_the_right_tuner():
    for gpu, tuner in (("b200", "tuner_config_a4.txtpb"), ("h200", "tuner_config_a3u.txtpb")):
        env = yaml.safe_load((ROOT / "runtime_env" / f"gke-{gpu}.yaml").read_text())["env_vars"]
        assert env["NCCL_TUNER_CONFIG_PATH"].endswith(tuner) and env["NCCL_NET"] == "gIB"
    for path in list((ROOT / "runtime_env").glob("*.yaml")) + MANIFESTS:
        text = path.read_text()
        assert "hf_" not in text.lower().replace("hf_token", "").replace("hf_home", ""), path
        env = (yaml.safe_load(text) or {}).get("env_vars", {})
        assert not {k for k in env if SECRET_KEY.search(k)}, path


def test_slurm_script_parses_and_marks_the_nodes_plan_lays_out():
    """deploy/slurm starts node i with the i-th of placement.node_markers: the markers the fit check's layout
    gives the first nodes (not run on a real Slurm cluster here: there is none)."""
    script = ROOT / "deploy" / "slurm" / "grpo-ray.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert "placement import node_markers" in script.read_text()
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        r = load_recipe(path, command="rm" if "\nrm:" in path.read_text() else "train")  # grpo-ray rm's own
        nodes, _ = placement.layout(r)
        marked = node_markers(r.cluster)
        assert [n.markers for n in nodes[: len(marked)]] == [(m,) for m in marked], path
        assert sum(r.cluster.node_markers.values()) == len(marked) <= r.cluster.nodes, path

"""A learner node removed mid-step on a simulated cluster (issue 78; ``ray.cluster_utils.Cluster``: raylets on this
machine, a removed one's actors killed as a lost node's are). With trainer.fault_tolerance=all the copies of the
ranks' state are kept on the driver's node, so the group started again on the node that replaces it takes them, and
the run finishes in the same job: every metric the uninterrupted run's on the same cluster, bit for bit (on-policy,
fixed seed, fp32), but the restart count."""

import json
import threading
import time

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.controller import GRPOController
from grpo_ray.setup_run import setup_run
from tests.conftest import ROOT
from tests.faults.conftest import differing

pytestmark = pytest.mark.slow

OVER = [
    "cluster.nodes=3",
    "+cluster.node_resources.generator=generation",
    "+cluster.node_resources.learner=training",
    "algorithm.kl_coef=0",  # the learner's node alone is lost
    "learner.mini_batch_size=128",  # two optimizer steps a step: the rank is lost after the first moved the weights
    "trainer.fault_tolerance=all",
    "trainer.total_steps=3",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.loggers=[jsonl]",
]


def train(out) -> list[dict]:
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [*OVER, f"trainer.output_dir={out}"])
    GRPOController(r, setup_run(r)).run()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.smoke  # issue 78's CI smoke: a learner node removed mid-run, the run finishing
def test_a_learner_node_removed_mid_step_and_the_run_finishes_on_the_node_that_replaces_it(
    tmp_path, monkeypatch, capsys
):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1, resources={"generation": 1})
    # two nodes for the learner's two ranks (packed on one of them): the other is where the group starts again (a
    # node can only be added from the main thread, which the run holds)
    training = [cluster.add_node(num_cpus=2, resources={"training": 1}) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    removed = []
    try:
        plain = train(tmp_path / "plain")
        capsys.readouterr()
        markers = tmp_path / "markers"
        markers.mkdir()
        monkeypatch.setenv("GRPO_RAY_FAULTS", "hold_learner@2")  # the last rank waits there for its node to go
        monkeypatch.setenv("GRPO_RAY_FAULTS_DIR", str(markers))

        def remove_when_held():
            try:
                while not (markers / "hold_learner@2").exists():
                    time.sleep(0.2)
                placed = json.loads((tmp_path / "lost" / "placement.json").read_text())
                ids = {a["node_id"] for a in placed["learner"]}
                removed.extend(n for n in training if n.node_id in ids)
                for node in removed:
                    cluster.remove_node(node)
            except BaseException as e:  # said in the assertion below
                removed.append(e)

        threading.Thread(target=remove_when_held, daemon=True).start()
        lost = train(tmp_path / "lost")
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert len(removed) == 1 and removed[0] in training, removed  # the learner's node, removed mid step 2
    assert [m["fault/learner_restarts"] for m in lost] == [0, 1, 1]
    assert [m["fault/learner_recovery_s"] > 0 for m in lost] == [False, True, True]  # timed, once
    said = capsys.readouterr().out
    assert said.count("recovered from lost actors (restarts: learner 1) in ") == 1  # the run's summary
    assert differing(lost, plain) <= {"fault/learner_restarts"}

"""A checkpoint's identity names its trainer's class: the recipe's run and the Python API's (the class
`training_wizard` exports) must agree, and a checkpoint written before a module moved must still resume."""

from training_wizard.run_folder import algorithm_class, identity_difference
from training_wizard.trainers.algorithms.grpo import GRPOTrainer as NativeGRPO
from training_wizard.trainers.algorithms.ppo import PPOTrainer as NativePPO
from training_wizard.trainers.algorithms.rloo import RLOOTrainer as NativeRLOO
from training_wizard.trl.trainers import GRPOTrainer, PPOTrainer, RLOOTrainer


def identity(kind: type) -> dict:
    kind = algorithm_class(kind)
    return {"trainer": f"{kind.__module__}.{kind.__qualname__}", "models": {}}


def test_the_exported_trainers_record_the_algorithm_a_recipe_records():
    for exported, native in ((GRPOTrainer, NativeGRPO), (RLOOTrainer, NativeRLOO), (PPOTrainer, NativePPO)):
        assert algorithm_class(exported) is native
        assert identity(exported) == identity(native)


def test_a_checkpoint_of_an_earlier_module_layout_resumes_and_another_algorithm_does_not():
    # joined so that no search-and-replace of module paths rewrites what an earlier version wrote
    earlier = {"trainer": ".".join(["training_wizard", "trainers", "grpo", "GRPOTrainer"]), "models": {}}
    assert identity_difference(earlier, identity(GRPOTrainer)) is None
    other = {"trainer": ".".join(["training_wizard", "trainers", "rloo", "RLOOTrainer"]), "models": {}}
    assert identity_difference(other, identity(GRPOTrainer)) == "written by RLOOTrainer, this run is GRPOTrainer"


def test_a_class_outside_the_package_is_its_own_identity():
    class Custom:
        pass

    assert algorithm_class(Custom) is Custom

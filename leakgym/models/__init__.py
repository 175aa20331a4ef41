"""Models attacked and defended in LeakGym, the PRECODE bottleneck, and the task loss.

Every model is ``body -> [PRECODE bottleneck] -> head`` (see :mod:`leakgym.models.base`, which also
documents BatchNorm handling: clients compute updates in train mode; a batch of one needs BN in eval
mode, see :func:`bn_eval_if_single`).

========== ===================================================== ===============
name       architecture                                          default width
========== ===================================================== ===============
lenet      DLG LeNet + 1 conv: 4 x conv5x5 + sigmoid, 1 linear    12 channels
convnet    Inverting Gradients ConvNet: 8 conv-BN-ReLU, 2 pools   16 (IG: 64)
mlp        PRECODE MLP: 4 x Linear-BN-ReLU                        1024
resnet18   ResNet-18, CIFAR stem, BasicBlocks [2, 2, 2, 2]        64
========== ===================================================== ===============

Computing a model for many parameter sets at once (the attack engine's rows, a vector env's clients, DCS²'s
concealed samples): :func:`leakgym.models.parameter_sets.batched_forward` and
:func:`~leakgym.models.parameter_sets.batched_loss`, the one entry point of its two forms --
:mod:`leakgym.models.rowwise` (a plain layer stack's loss per row, without vmap) and ``vmap`` with
:mod:`leakgym.models.convolution` (convolutions as unfold + matrix product).
"""

from leakgym.models.base import (
    BatchNormInputStatistics,
    LeakGymModel,
    bn_eval_if_single,
    has_batchnorm,
    in_mode,
    task_loss,
)
from leakgym.models.build import MODEL_CLASSES, MODEL_NAMES, build_model
from leakgym.models.convnet import ConvNet
from leakgym.models.lenet import LeNet
from leakgym.models.mlp import MLP
from leakgym.models.precode import (
    DEFAULT_PRECODE_BETA,
    DEFAULT_PRECODE_DIM,
    VariationalBottleneck,
    precode_layer_split,
)
from leakgym.models.resnet import ResNet18

__all__ = [
    "DEFAULT_PRECODE_BETA",
    "DEFAULT_PRECODE_DIM",
    "MLP",
    "MODEL_CLASSES",
    "MODEL_NAMES",
    "BatchNormInputStatistics",
    "ConvNet",
    "LeNet",
    "LeakGymModel",
    "ResNet18",
    "VariationalBottleneck",
    "bn_eval_if_single",
    "build_model",
    "has_batchnorm",
    "in_mode",
    "precode_layer_split",
    "task_loss",
]

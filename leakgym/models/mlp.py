"""The MLP of the PRECODE / PPP papers (Scheliga et al. 2022, Sec. 3.2 and Supplementary Material).

"Four hidden layers [...], batch normalization and ReLU activation"; the output layer has one unit per
class (softmax is folded into the cross-entropy). Each hidden layer is ``Linear -> BatchNorm1d ->
ReLU`` (the order of the official code's ``MLPBlock``). The hidden width is ``1024``, the width of the
official PRECODE repository's MLP (``src/model.py``).

The first layer is an ``nn.Linear`` *with bias* acting on the flattened normalised image: analytic
attacks (Phong et al. 2017; PPP Supplementary Eq. 5) recover its input exactly as
``x = dL/dW_i / dL/db_i`` for any row ``i`` with a non-zero bias gradient.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from leakgym.data.spec import DatasetSpec
from leakgym.models.base import LeakGymModel
from leakgym.models.precode import DEFAULT_PRECODE_BETA

DEFAULT_MLP_WIDTH = 1024
"""Hidden width of the official PRECODE MLP."""

NUM_HIDDEN_LAYERS = 4


class MLP(LeakGymModel):
    """Flatten, 4 x (Linear(width) + BatchNorm1d + ReLU), linear head."""

    min_image_size = 1

    def __init__(self, spec: DatasetSpec, *, width: int = DEFAULT_MLP_WIDTH, precode: bool = False,
                 precode_dim: int | None = None, precode_beta: float = DEFAULT_PRECODE_BETA) -> None:
        if width < 1:
            raise ValueError(f"MLP width={width} must be >= 1")
        layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
        in_dim = spec.channels * spec.image_size * spec.image_size
        for i in range(1, NUM_HIDDEN_LAYERS + 1):
            layers[f"fc{i}"] = nn.Linear(in_dim, width, bias=True)
            layers[f"bn{i}"] = nn.BatchNorm1d(width)
            layers[f"relu{i}"] = nn.ReLU()
            in_dim = width
        super().__init__(spec, nn.Sequential(layers), width, precode=precode, precode_dim=precode_dim,
                         precode_beta=precode_beta)

    @property
    def first_layer(self) -> nn.Linear:
        """The input layer ``body.fc1`` (weight ``(width, C*H*W)``, with bias)."""
        return self.body.fc1

"""Saved Stable-Baselines3 policies: written by ``leakgym train``, loaded without un-pickling anything.

A saved policy is two files side by side:

``<name>.zip``
    Stable-Baselines3's own format (``model.save``), so SB3 and its tools can still open it.
``<name>.json``
    LeakGym's metadata, plain JSON: ``format``, algorithm, role, environment, the observation and
    action spaces, the network architecture (``policy``: ``net_arch``, the activation's name from
    :data:`ACTIVATIONS`, ``share_features_extractor``, ``normalize_images``) and training details.

Loading (:func:`load_policy`, used by :class:`LearnedAgent` and so by ``make_agent``,
``gym.make(..., opponent=...)``, ``leakgym eval`` and ``leakgym train --opponent``) never calls
SB3's ``load``: that un-pickles the ``:serialized:`` entries of the zip's ``data`` with cloudpickle,
which runs any code the file names. Instead the network is rebuilt from the JSON (every value
checked against its allowed type and range) and its weights are read from the zip's ``policy.pth``
entry alone, with ``torch.load(weights_only=True)`` (tensors and plain containers; anything else is
refused). Nothing else in the zip is opened. A policy without its JSON file is refused; one trained
outside LeakGym can be re-saved with :func:`save_policy`.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .base import Agent
from .scripted import ROLES

ALGORITHMS = ("ppo", "a2c")
#: ``format`` value of a LeakGym policy JSON file
POLICY_FORMAT = "leakgym-policy-v1"
#: activation functions a saved policy may name (``torch.nn`` classes)
ACTIVATIONS = ("Tanh", "ReLU", "LeakyReLU", "ELU", "GELU", "SiLU", "Sigmoid")
#: the zip entry holding the policy network's ``state_dict``
WEIGHTS_ENTRY = "policy.pth"
#: bounds on what a policy file may ask to allocate
MAX_WEIGHTS_BYTES = 256 * 2**20
MAX_LAYERS = 16
MAX_LAYER_WIDTH = 4096
MAX_OBS_SIZE = 2**16
MAX_ACTION_DIMS = 256
MAX_ACTION_CHOICES = 2**16


def algorithm_class(algo: str):
    """The SB3 class of ``algo`` ("ppo" or "a2c")."""
    from stable_baselines3 import A2C, PPO

    classes = {"ppo": PPO, "a2c": A2C}
    if algo not in classes:
        raise ValueError(f"algo={algo!r}; allowed: {ALGORITHMS}")
    return classes[algo]


def metadata_path(policy_path: str | Path) -> Path:
    """``policy.zip`` -> ``policy.json`` (the metadata file beside a saved policy)."""
    return Path(policy_path).with_suffix(".json")


# ------------------------------------------------------------------------------------- saving
def policy_spec(model) -> dict[str, Any]:
    """The spaces and network architecture of an SB3 model, as plain JSON values.

    Raises ``ValueError`` for what :func:`load_policy` cannot rebuild (another policy class, a
    custom feature extractor or activation, spaces other than ``Box`` observations and
    ``MultiDiscrete`` actions).
    """
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor

    policy = model.policy
    obs, act = policy.observation_space, policy.action_space
    problems = []
    if type(policy) is not ActorCriticPolicy:
        problems.append(f"policy class {type(policy).__name__} (allowed: ActorCriticPolicy, i.e. MlpPolicy)")
    if policy.features_extractor_class is not FlattenExtractor or policy.features_extractor_kwargs:
        problems.append(f"feature extractor {policy.features_extractor_class.__name__} (allowed: FlattenExtractor)")
    name = policy.activation_fn.__name__
    if name not in ACTIVATIONS or getattr(torch.nn, name) is not policy.activation_fn:
        problems.append(f"activation {name} (allowed: {', '.join(ACTIVATIONS)})")
    if not isinstance(obs, spaces.Box) or not isinstance(act, spaces.MultiDiscrete):
        problems.append(f"spaces {obs} / {act} (allowed: Box observations, MultiDiscrete actions)")
    if problems:
        raise ValueError("LeakGym cannot save this policy in a form it can load safely: " + "; ".join(problems))
    return {
        "observation_space": {
            "shape": list(obs.shape),
            "low": obs.low.astype(np.float64).ravel().tolist(),
            "high": obs.high.astype(np.float64).ravel().tolist(),
        },
        "action_space": {"nvec": np.asarray(act.nvec).astype(int).ravel().tolist()},
        "policy": {
            "class": "ActorCriticPolicy",
            "net_arch": policy.net_arch,
            "activation_fn": name,
            "share_features_extractor": bool(policy.share_features_extractor),
            "normalize_images": bool(policy.normalize_images),
        },
    }


def save_policy(model, path: str | Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """``model.save(path)`` and, beside it, the JSON file :func:`load_policy` needs.

    ``metadata`` must hold ``algo`` and ``role``; it is stored with the spaces and architecture
    (:func:`policy_spec`). Returns what was written to the JSON file.
    """
    spec = policy_spec(model)
    payload = {"format": POLICY_FORMAT, **metadata, **spec}
    _check_metadata(payload, metadata_path(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    metadata_path(path).write_text(json.dumps(payload, indent=2, default=str))
    return payload


# ------------------------------------------------------------------------------------- loading
def _int_list(value: Any, *, low: int, high: int, max_len: int) -> bool:
    return (
        isinstance(value, list)
        and 1 <= len(value) <= max_len
        and all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value)
    )


def _layer_lists(arch: Any) -> list[Any] | None:
    """The layer-width lists of a ``net_arch`` (a list, or a dict of exactly ``pi`` and ``vf``); else None."""
    if isinstance(arch, list):
        return [arch]
    if isinstance(arch, dict) and set(arch) == {"pi", "vf"}:
        return [arch["pi"], arch["vf"]]
    return None


def _check_metadata(meta: Any, where: Path) -> None:
    """Raise ``ValueError`` naming ``where`` and the field unless ``meta`` is a loadable policy description."""

    def bad(field: str, allowed: str, value: Any) -> ValueError:
        return ValueError(f"{where}: {field} must be {allowed}; got {value!r}")

    if not isinstance(meta, dict):
        raise bad("the file", "a JSON object", type(meta).__name__)
    if meta.get("format") != POLICY_FORMAT:
        raise bad(
            "'format'", f"{POLICY_FORMAT!r} (re-save the policy with `leakgym train` or leakgym.agents.learned.save_policy)",
            meta.get("format"),
        )
    if meta.get("algo") not in ALGORITHMS:
        raise bad("'algo'", f"one of {ALGORITHMS}", meta.get("algo"))
    if meta.get("role") not in ROLES:
        raise bad("'role'", f"one of {ROLES}", meta.get("role"))
    obs = meta.get("observation_space")
    if not isinstance(obs, dict) or not _int_list(obs.get("shape"), low=1, high=MAX_OBS_SIZE, max_len=1):
        raise bad("'observation_space.shape'", f"[n] with 1 <= n <= {MAX_OBS_SIZE}", obs)
    size = obs["shape"][0]
    for key in ("low", "high"):
        bound = obs.get(key)
        if not (isinstance(bound, list) and len(bound) == size
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bound)):
            raise bad(f"'observation_space.{key}'", f"a list of {size} finite numbers", bound)
    act = meta.get("action_space")
    nvec = act.get("nvec") if isinstance(act, dict) else act
    if not _int_list(nvec, low=1, high=MAX_ACTION_CHOICES, max_len=MAX_ACTION_DIMS):
        raise bad(
            "'action_space.nvec'", f"a list of 1..{MAX_ACTION_DIMS} integers in 1..{MAX_ACTION_CHOICES}", nvec
        )
    pol = meta.get("policy")
    if not isinstance(pol, dict) or pol.get("class") != "ActorCriticPolicy":
        raise bad("'policy.class'", "'ActorCriticPolicy'", pol.get("class") if isinstance(pol, dict) else pol)
    arch = pol.get("net_arch")
    layers = _layer_lists(arch)
    if layers is None or not all(
        layer == [] or _int_list(layer, low=1, high=MAX_LAYER_WIDTH, max_len=MAX_LAYERS) for layer in layers
    ):
        raise bad(
            "'policy.net_arch'",
            f"a list of up to {MAX_LAYERS} layer widths in 1..{MAX_LAYER_WIDTH}, or {{'pi': [...], 'vf': [...]}}",
            arch,
        )
    if pol.get("activation_fn") not in ACTIVATIONS:
        raise bad("'policy.activation_fn'", f"one of {ACTIVATIONS}", pol.get("activation_fn"))
    for key in ("share_features_extractor", "normalize_images"):
        if not isinstance(pol.get(key), bool):
            raise bad(f"'policy.{key}'", "true or false", pol.get(key))


def read_metadata(policy_path: str | Path) -> dict[str, Any]:
    """The checked JSON file saved beside a policy (``ValueError`` when missing or malformed)."""
    meta_file = metadata_path(policy_path)
    if not meta_file.is_file():
        raise ValueError(
            f"policy {str(policy_path)!r} has no {meta_file.name} beside it ({meta_file}). LeakGym loads only "
            "policies saved by `leakgym train` / `leakgym selfplay` or leakgym.agents.learned.save_policy, because "
            "Stable-Baselines3's own loader runs code stored in the zip"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{meta_file}: cannot read the policy metadata ({exc})") from None
    _check_metadata(meta, meta_file)
    return meta


def _read_weights(path: Path, device: str) -> dict[str, Any]:
    """The ``state_dict`` in the zip's ``policy.pth``, read with ``torch.load(weights_only=True)``."""
    import torch

    try:
        with zipfile.ZipFile(path) as zf:
            try:
                info = zf.getinfo(WEIGHTS_ENTRY)
            except KeyError:
                raise ValueError(
                    f"{path}: no {WEIGHTS_ENTRY} entry; not a Stable-Baselines3 policy zip (entries: {zf.namelist()[:10]})"
                ) from None
            if info.file_size > MAX_WEIGHTS_BYTES:
                raise ValueError(f"{path}: {WEIGHTS_ENTRY} holds {info.file_size} bytes, more than {MAX_WEIGHTS_BYTES}")
            raw = zf.read(info)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable zip file ({exc})") from None
    try:
        state = torch.load(io.BytesIO(raw), map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError,
            zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{path}: {WEIGHTS_ENTRY} is not a plain tensor state_dict; refused to load it ({first})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path}: {WEIGHTS_ENTRY} must hold a dict of named tensors; got {type(state).__name__}")
    return state


def load_policy(path: str | Path, device: str = "cpu"):
    """``(policy, metadata)``: the SB3 ``ActorCriticPolicy`` saved at ``path``, rebuilt from its JSON file.

    See the module docstring for what is read. Raises ``ValueError`` naming the file for a missing
    or malformed JSON file, a zip without ``policy.pth``, weights that are not plain tensors (a
    pickle naming any other object is refused before it runs), or weights that do not fit the
    architecture the JSON describes.
    """
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"policy file {str(path)!r} does not exist")
    meta = read_metadata(path)
    obs_meta, pol = meta["observation_space"], meta["policy"]
    observation_space = spaces.Box(
        low=np.asarray(obs_meta["low"], np.float32).reshape(obs_meta["shape"]),
        high=np.asarray(obs_meta["high"], np.float32).reshape(obs_meta["shape"]),
        dtype=np.float32,
    )
    action_space = spaces.MultiDiscrete(np.asarray(meta["action_space"]["nvec"], np.int64))
    policy = ActorCriticPolicy(
        observation_space,
        action_space,
        lr_schedule=lambda _: 0.0,  # no optimiser steps: the policy only acts
        net_arch=pol["net_arch"],
        activation_fn=getattr(torch.nn, pol["activation_fn"]),
        share_features_extractor=pol["share_features_extractor"],
        normalize_images=pol["normalize_images"],
    )
    state = _read_weights(path, device)
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"{path}: the weights do not fit the architecture in {metadata_path(path).name} ({exc})"
        ) from None
    policy.to(device)
    policy.set_training_mode(False)
    return policy, meta


class LearnedAgent(Agent):
    """Acts with a saved SB3 policy (see :func:`load_policy`). ``deterministic=False`` samples instead.

    With ``role`` and ``scenario`` the policy is checked before use: it must have been trained for
    that role, with that role's action space in the scenario; observations are checked on each call.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        role: str | None = None,
        scenario: Any = None,
        deterministic: bool = True,
        device: str = "cpu",
    ) -> None:
        self.path = Path(path)
        self.policy, self.metadata = load_policy(self.path, device=device)
        self.algo: str = self.metadata["algo"]
        self.deterministic = deterministic
        self.name = f"{self.algo}:{path}"
        trained_as = self.metadata["role"]
        if role is not None and role != trained_as:
            raise ValueError(f"policy {str(self.path)!r} was trained as the {trained_as}; it cannot play the {role}")
        if scenario is not None:
            nvec = np.asarray(getattr(scenario, f"{role or trained_as}_nvec"))
            self._check_action_nvec(nvec, f"the {role or trained_as}'s action space in this scenario")

    def _describe(self) -> str:
        keys = ("env_id", "role", "overrides")
        return ", ".join(f"{k}={self.metadata[k]!r}" for k in keys if k in self.metadata)

    def _check_action_nvec(self, nvec: np.ndarray, what: str) -> None:
        want = np.asarray(self.policy.action_space.nvec)
        if want.shape != nvec.shape or not np.array_equal(want, nvec):
            raise ValueError(
                f"policy {str(self.path)!r} acts in MultiDiscrete({want.tolist()}), but {what} is "
                f"MultiDiscrete({nvec.tolist()}): it was trained on another scenario or role ({self._describe()})"
            )

    def check_spaces(self, observation: np.ndarray, action_space) -> None:
        """Raise ``ValueError`` when the policy was trained on different spaces than it is given."""
        want_obs = self.policy.observation_space.shape
        if tuple(np.shape(observation)) != tuple(want_obs):
            raise ValueError(
                f"policy {str(self.path)!r} expects observations of shape {want_obs}, got "
                f"{tuple(np.shape(observation))}: it was trained on another scenario or role ({self._describe()})"
            )
        self._check_action_nvec(np.asarray(getattr(action_space, "nvec", None)), f"this role's action space {action_space}")

    def act(self, observation, action_space, rng):
        self.check_spaces(observation, action_space)
        action, _ = self.policy.predict(np.asarray(observation, dtype=np.float32), deterministic=self.deterministic)
        return np.asarray(action, dtype=np.int64)


__all__ = [
    "ACTIVATIONS",
    "ALGORITHMS",
    "POLICY_FORMAT",
    "LearnedAgent",
    "algorithm_class",
    "load_policy",
    "metadata_path",
    "policy_spec",
    "read_metadata",
    "save_policy",
]

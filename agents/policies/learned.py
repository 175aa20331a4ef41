"""Saved Stable-Baselines3 policies: written by ``leakgym train``, loaded without un-pickling anything.

A saved policy is two files side by side:

``<name>.zip``
    Stable-Baselines3's own format (``model.save``), so SB3 and its tools can still open it.
``<name>.json``
    LeakGym's metadata, plain JSON: ``format``, algorithm, role, environment, the observation and
    action spaces, the network architecture (``policy``: ``class``, ``net_arch``, the activation's
    name from :data:`ACTIVATIONS`, ``normalize_images`` and, for actor-critic policies,
    ``share_features_extractor``) and training details.

Three algorithms are supported: PPO and A2C (``ActorCriticPolicy``, i.e. ``MlpPolicy``) and DQN
(``DQNPolicy``). The action space is ``MultiDiscrete`` (``{"nvec": [...]}``) or, for a policy
trained with ``flat_actions=True``, ``Discrete`` (``{"n": N}``; with ``"nvec"`` too when the
``MultiDiscrete`` menu it flattens is known). A :class:`LearnedAgent` plays either kind in either
kind of space: a flat index ``k`` is the C-order flattening of the menu,
``np.unravel_index(k, nvec)``, as in :class:`leakgym.game.menus.FlatActions`.

Loading (:func:`load_policy`, used by :class:`LearnedAgent` and so by ``make_agent``,
``gym.make(..., opponent=...)``, ``leakgym eval`` and ``leakgym train --opponent``) never calls
SB3's ``load``: that un-pickles the ``:serialized:`` entries of the zip's ``data`` with cloudpickle,
which runs any code the file names. Instead the network is rebuilt from the JSON (every value
checked against its allowed type and range) and its weights are read from the zip's ``policy.pth``
entry alone, with ``torch.load(weights_only=True)`` (tensors and plain containers; anything else is
refused). Nothing else in the zip is opened. A policy without its JSON file is refused; one trained
outside LeakGym can be re-saved with :func:`save_policy`.

Everything a file may make the loader allocate is bounded before it is allocated: the JSON file's size
(:data:`MAX_METADATA_BYTES`) and nesting depth (:data:`MAX_JSON_DEPTH`, checked before parsing), the
network it describes (:data:`MAX_POLICY_PARAMETERS`, from the JSON alone), and the weights by the bytes they
occupy: ``policy.pth`` at most :data:`MAX_WEIGHTS_BYTES`, every tensor dense, contiguous and apart from
the others (an expanded, stride-0 tensor is refused before anything reads it), and the network built
only once the weights hold at least as many numbers as it needs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.devices import check_device, in_library_modes, python_random_kept
from leakgym.files import replacing

from .base import Agent
from .scripted import ROLES

ALGORITHMS = ("ppo", "a2c", "dqn")
#: the policy class each algorithm's saved policy must have (SB3's ``MlpPolicy`` of that algorithm)
POLICY_CLASSES = {"ppo": "ActorCriticPolicy", "a2c": "ActorCriticPolicy", "dqn": "DQNPolicy"}
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
#: most actions of a flat (``Discrete``) policy
MAX_FLAT_ACTIONS = 2**20
#: most parameters the network a ``policy.json`` describes may have (the actor and the critic, or DQN's
#: two Q-networks, together): 2**24 = 16.8 M, 64 MiB of float32, which any machine that runs LeakGym
#: holds, and 1,500 times what LeakGym's policies need: the largest ``leakgym train`` builds by default
#: (PPO's ``[64, 64]`` on LeakGym-Digits-v0's attacker observation) has 11,341, which
#: :func:`_most_parameters` (an upper bound, generous by up to 3x) counts as 32,306
MAX_POLICY_PARAMETERS = 2**24
#: largest ``policy.json`` read (the observation bounds of a 2**16-entry observation take about 3 MB)
MAX_METADATA_BYTES = 16 * 2**20
#: deepest nesting of lists and objects in a ``policy.json`` (a valid one nests 4 deep); deeper files are
#: refused before they are parsed (Python's JSON parser ends a deep one with a RecursionError)
MAX_JSON_DEPTH = 32
#: largest magnitude of an observation bound (the observation space is float32)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def algorithm_class(algo: str):
    """The SB3 class of ``algo`` ("ppo", "a2c" or "dqn")."""
    from stable_baselines3 import A2C, DQN, PPO

    classes = {"ppo": PPO, "a2c": A2C, "dqn": DQN}
    if algo not in classes:
        raise ValueError(f"algo={algo!r}; allowed: {ALGORITHMS}")
    return classes[algo]


def metadata_path(policy_path: str | Path) -> Path:
    """``policy.zip`` -> ``policy.json`` (the metadata file beside a saved policy)."""
    return Path(policy_path).with_suffix(".json")


# ------------------------------------------------------------------------------------- saving
def _policy_classes() -> dict[str, type]:
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.dqn.policies import DQNPolicy

    return {"ActorCriticPolicy": ActorCriticPolicy, "DQNPolicy": DQNPolicy}


def policy_spec(model, flat_nvec: Any = None) -> dict[str, Any]:
    """The spaces and network architecture of an SB3 model, as plain JSON values.

    ``flat_nvec``: for a ``Discrete`` action space, the ``MultiDiscrete`` menu it flattens (recorded
    so that the policy is checked against a scenario's menu, not only its size). Raises
    ``ValueError`` for what :func:`load_policy` cannot rebuild (another policy class, a custom
    feature extractor or activation, spaces other than ``Box`` observations and ``MultiDiscrete``
    or ``Discrete`` actions).
    """
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.torch_layers import FlattenExtractor

    policy = model.policy
    obs, act = policy.observation_space, policy.action_space
    classes = _policy_classes()
    problems = []
    class_name = next((name for name, cls in classes.items() if type(policy) is cls), None)
    if class_name is None:
        problems.append(f"policy class {type(policy).__name__} (allowed: {', '.join(classes)}, i.e. MlpPolicy)")
    if policy.features_extractor_class is not FlattenExtractor or policy.features_extractor_kwargs:
        problems.append(f"feature extractor {policy.features_extractor_class.__name__} (allowed: FlattenExtractor)")
    name = policy.activation_fn.__name__
    if name not in ACTIVATIONS or getattr(torch.nn, name) is not policy.activation_fn:
        problems.append(f"activation {name} (allowed: {', '.join(ACTIVATIONS)})")
    if not isinstance(obs, spaces.Box) or not isinstance(act, (spaces.MultiDiscrete, spaces.Discrete)):
        problems.append(f"spaces {obs} / {act} (allowed: Box observations, MultiDiscrete or Discrete actions)")
    if isinstance(act, spaces.Discrete) and flat_nvec is not None and int(np.prod(flat_nvec)) != int(act.n):
        problems.append(f"flat_nvec {list(flat_nvec)} (its product must be the Discrete action count {int(act.n)})")
    if problems:
        raise ValueError("LeakGym cannot save this policy in a form it can load safely: " + "; ".join(problems))
    if isinstance(act, spaces.Discrete):
        action_space: dict[str, Any] = {"n": int(act.n)}
        if flat_nvec is not None:
            action_space["nvec"] = np.asarray(flat_nvec).astype(int).ravel().tolist()
    else:
        action_space = {"nvec": np.asarray(act.nvec).astype(int).ravel().tolist()}
    description: dict[str, Any] = {"class": class_name, "net_arch": policy.net_arch, "activation_fn": name}
    if class_name == "ActorCriticPolicy":
        description["share_features_extractor"] = bool(policy.share_features_extractor)
    description["normalize_images"] = bool(policy.normalize_images)
    return {
        "observation_space": {
            "shape": list(obs.shape),
            "low": obs.low.astype(np.float64).ravel().tolist(),
            "high": obs.high.astype(np.float64).ravel().tolist(),
        },
        "action_space": action_space,
        "policy": description,
    }


def save_policy(model, path: str | Path, metadata: dict[str, Any], *, flat_nvec: Any = None) -> dict[str, Any]:
    """``model.save(path)`` and, beside it, the JSON file :func:`load_policy` needs.

    ``metadata`` must hold ``algo`` and ``role``; it is stored with the spaces and architecture
    (:func:`policy_spec`, which also takes ``flat_nvec``). Returns what was written to the JSON file.
    """
    payload = savable_payload(model, metadata, metadata_path(path), flat_nvec=flat_nvec)
    for name, tensor in model.policy.state_dict().items():
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            # load_policy refuses such weights: say so where they were made, not where they are read
            raise ValueError(f"{path}: the policy's {name} holds non-finite values (the training diverged); not saved")
    path = Path(path)
    if not path.suffix:  # as SB3's save names it (it appends .zip to a name without a suffix)
        path = path.with_suffix(".zip")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Both files written beside their names, then renamed together: an interruption leaves the earlier pair
    # (or none), never a new policy.zip beside an older policy.json.
    with contextlib.ExitStack() as stack:
        weights, description = (stack.enter_context(replacing(p)) for p in (path, metadata_path(path)))
        model.save(weights)
        description.write_text(json.dumps(payload, indent=2, default=str))
    return payload


def savable_payload(model, metadata: dict[str, Any], where: Path, *, flat_nvec: Any = None) -> dict[str, Any]:
    """The JSON payload :func:`save_policy` writes for ``model``, checked as :func:`load_policy` checks it
    (``ValueError`` naming ``where``): training calls it before it starts, so a policy that could not be
    saved (an architecture beyond the loader's limits) is refused before the run, not after it."""
    payload = {"format": POLICY_FORMAT, **metadata, **policy_spec(model, flat_nvec)}
    _check_metadata(payload, where)
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
            "'format'", f"{POLICY_FORMAT!r} (re-save the policy with `leakgym train` or leakgym.agents.save_policy)",
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
        # the bounds become float32 (a huge int made math.isfinite raise OverflowError; one past float32's
        # range became an infinite bound)
        if not (isinstance(bound, list) and len(bound) == size
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= FLOAT32_MAX
                        for v in bound)):
            raise bad(f"'observation_space.{key}'", f"a list of {size} finite numbers of float32's range "
                      f"(at most {FLOAT32_MAX:.4g} in size)", bound)
    crossed = next((i for i, (lo, hi) in enumerate(zip(obs["low"], obs["high"])) if lo > hi), None)
    if crossed is not None:  # gymnasium's Box refused it without naming the file
        raise bad("'observation_space.low'", "at most 'observation_space.high' at every index",
                  f"low[{crossed}]={obs['low'][crossed]!r} > high[{crossed}]={obs['high'][crossed]!r}")
    act = meta.get("action_space")
    if not isinstance(act, dict):  # (save_policy writes an object; every reader below takes one)
        raise bad("'action_space'", "an object with 'nvec' (or 'n' and 'nvec')", act)
    flat = "n" in act
    nvec = act.get("nvec")
    if flat:
        n = act["n"]
        if not _int_list([n], low=1, high=MAX_FLAT_ACTIONS, max_len=1):
            raise bad("'action_space.n'", f"an integer in 1..{MAX_FLAT_ACTIONS}", n)
    if not (flat and nvec is None) and not _int_list(nvec, low=1, high=MAX_ACTION_CHOICES, max_len=MAX_ACTION_DIMS):
        raise bad(
            "'action_space.nvec'", f"a list of 1..{MAX_ACTION_DIMS} integers in 1..{MAX_ACTION_CHOICES}", nvec
        )
    if flat and nvec is not None and math.prod(nvec) != act["n"]:
        raise bad("'action_space.nvec'", f"a menu whose product is action_space.n = {act['n']}", nvec)
    pol = meta.get("policy")
    want_class = POLICY_CLASSES[meta["algo"]]
    if not isinstance(pol, dict) or pol.get("class") != want_class:
        raise bad(
            "'policy.class'", f"{want_class!r} (for algo {meta['algo']!r})", pol.get("class") if isinstance(pol, dict) else pol
        )
    arch = pol.get("net_arch")
    layers = _layer_lists(arch) if want_class == "ActorCriticPolicy" or isinstance(arch, list) else None
    if layers is None or not all(
        layer == [] or _int_list(layer, low=1, high=MAX_LAYER_WIDTH, max_len=MAX_LAYERS) for layer in layers
    ):
        raise bad(
            "'policy.net_arch'",
            f"a list of up to {MAX_LAYERS} layer widths in 1..{MAX_LAYER_WIDTH}"
            + (", or {'pi': [...], 'vf': [...]}" if want_class == "ActorCriticPolicy" else ""),
            arch,
        )
    parameters = _most_parameters(meta)
    if parameters > MAX_POLICY_PARAMETERS:
        raise bad("'policy.net_arch'", f"a network of at most {MAX_POLICY_PARAMETERS} parameters "
                  f"(MAX_POLICY_PARAMETERS; this one has up to {parameters})", arch)
    if pol.get("activation_fn") not in ACTIVATIONS:
        raise bad("'policy.activation_fn'", f"one of {ACTIVATIONS}", pol.get("activation_fn"))
    flags = ("share_features_extractor", "normalize_images") if want_class == "ActorCriticPolicy" else ("normalize_images",)
    for key in flags:
        if not isinstance(pol.get(key), bool):
            raise bad(f"'policy.{key}'", "true or false", pol.get(key))


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text`` (string contents not counted), computed
    without parsing: what :func:`read_metadata` bounds before ``json.loads`` recurses."""
    import re

    depth = deepest = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def read_metadata(policy_path: str | Path) -> dict[str, Any]:
    """The checked JSON file saved beside a policy (``ValueError`` when missing or malformed)."""
    meta_file = metadata_path(policy_path)
    if not meta_file.is_file():
        raise ValueError(
            f"policy {str(policy_path)!r} has no {meta_file.name} beside it ({meta_file}). LeakGym loads only "
            "policies saved by `leakgym train` / `leakgym selfplay` or leakgym.agents.save_policy, because "
            "Stable-Baselines3's own loader runs code stored in the zip"
        )
    try:
        size = meta_file.stat().st_size
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"{meta_file}: {size} bytes; allowed: at most {MAX_METADATA_BYTES} (MAX_METADATA_BYTES)")
        text = meta_file.read_text()
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{meta_file}: lists and objects nested {depth} deep; allowed: at most {MAX_JSON_DEPTH}")
        meta = json.loads(text, parse_int=_parse_int)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{meta_file}: cannot read the policy metadata ({exc})") from None
    long_int = _find_long_int(meta)
    if long_int is not None:
        field, value = long_int
        raise ValueError(f"{meta_file}: '{field}' must be an integer of at most {value.limit} digits; got one of "
                         f"{value.digits} digits")
    _check_metadata(meta, meta_file)
    return meta


class _LongInt:
    """What :func:`read_metadata` parses an integer of more digits than Python converts into
    (``sys.get_int_max_str_digits``): ``json.loads`` raised a ValueError naming neither the file nor the
    field; this stands in for it until :func:`_find_long_int` names the field."""

    def __init__(self, text: str, limit: int) -> None:
        self.digits, self.limit = len(text.lstrip("-")), limit

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | _LongInt:
    # (the limit came with Python 3.10.7 and 3.11; earlier versions convert any length: found in a review)
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    return _LongInt(text, limit) if limit and len(text.lstrip("-")) > limit else int(text)


def _find_long_int(value: Any) -> tuple[str, _LongInt] | None:
    """``(dotted field, stand-in)`` of the first :class:`_LongInt` in parsed JSON (nested at most
    :data:`MAX_JSON_DEPTH` deep: read_metadata checked it), or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        field, item = stack.pop()
        if isinstance(item, _LongInt):
            return field, item
        if isinstance(item, dict):
            stack.extend((f"{field}.{k}" if field else str(k), v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{field}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


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
        with warnings.catch_warnings():  # (a raw pickle gets torch's legacy-format warning before its refusal below)
            warnings.simplefilter("ignore")
            state = torch.load(io.BytesIO(raw), map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of the (weights-only) reader: a corrupt file
        # (a damaged pickle raised KeyError or AssertionError from inside torch's reader)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{path}: {WEIGHTS_ENTRY} is not a plain tensor state_dict; refused to load it ({first})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path}: {WEIGHTS_ENTRY} must hold a dict of named tensors; got {type(state).__name__}")
    _check_storage(path, state)
    for name, tensor in state.items():
        # NaN weights made PPO fail at its first move mid-episode and DQN play action 0 for ever
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            raise ValueError(f"{path}: {WEIGHTS_ENTRY} tensor {name!r} holds non-finite values; refused to load it")
    return state


def _check_storage(path: Path, state: dict[str, Any]) -> None:
    """The weights are what they occupy: every tensor dense, contiguous and inside its storage, and no two
    overlapping. Checked before any computation touches a tensor: a stride-0 (expanded) tensor stores one
    number and reads as millions (``isfinite`` on one 4,096 x 4,096 x 128 view allocated 8 GB from a
    118 KB file). With these, the tensors' materialised bytes are at most their storages' bytes, which
    torch's reader holds to the sizes of the file's data records (a record shorter than its storage is
    refused by ``torch.load``), which are at most the entry's :data:`MAX_WEIGHTS_BYTES`."""
    import torch

    def refuse(name: str, why: str) -> ValueError:
        return ValueError(f"{path}: {WEIGHTS_ENTRY} tensor {name!r} {why}; refused to load it")

    spans: dict[int, list[tuple[int, int, str]]] = {}
    for name, tensor in state.items():
        if tensor.layout != torch.strided:
            raise refuse(name, f"has layout {tensor.layout}; allowed: dense (torch.strided)")
        if not tensor.is_contiguous():
            raise refuse(name, f"is not contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()}: an "
                         "expanded or strided view, larger in memory than in the file)")
        size = tensor.numel() * tensor.element_size()
        if size == 0:
            continue
        start = tensor.storage_offset() * tensor.element_size()  # torch's reader keeps a view inside its storage
        spans.setdefault(tensor.untyped_storage().data_ptr(), []).append((start, start + size, name))
    for members in spans.values():
        members.sort()
        for (_, end, first), (begin, _, second) in itertools.pairwise(members):
            if begin < end:
                raise refuse(second, f"overlaps tensor {first!r} in their shared storage")


def _most_parameters(meta: dict[str, Any]) -> int:
    """An upper bound on the parameters of the network ``meta`` describes (its fields checked already):
    every layer list of ``net_arch`` as a chain of linear layers from the observation with an action head,
    twice (a list ``net_arch`` of PPO/A2C builds the actor's and the critic's, DQN its Q-network and its
    target), plus the critic's value head."""
    width = meta["observation_space"]["shape"][0]
    act = meta["action_space"]
    outputs = act["n"] if isinstance(act, dict) and "n" in act else sum(act["nvec"] if isinstance(act, dict) else act)
    total = 0
    for layers in _layer_lists(meta["policy"]["net_arch"]):
        prev, chain = width, 0
        for w in layers:
            chain += prev * w + w
            prev = w
        total += 2 * (chain + prev * outputs + outputs)
    return total + 2 * MAX_LAYER_WIDTH + 2


def _least_parameters(meta: dict[str, Any]) -> int:
    """A lower bound on the parameters of the network ``meta`` describes: each layer list of its
    ``net_arch`` as a chain of linear layers from the observation, plus the action head on the first
    list (SB3 builds at least these; DQN builds them twice, a list ``net_arch`` of PPO/A2C twice)."""
    width = meta["observation_space"]["shape"][0]
    act = meta["action_space"]
    outputs = act["n"] if "n" in act else sum(act["nvec"])
    total = 0
    for k, layers in enumerate(_layer_lists(meta["policy"]["net_arch"])):
        prev = width
        for w in layers:
            total += prev * w + w
            prev = w
        if k == 0:
            total += prev * outputs + outputs
    return total


def _action_space(meta: dict[str, Any]):
    from gymnasium import spaces

    act = meta["action_space"]
    if "n" in act:
        return spaces.Discrete(int(act["n"]))
    return spaces.MultiDiscrete(np.asarray(act["nvec"], np.int64))


@in_library_modes
@python_random_kept()  # (Stable-Baselines3's first import draws from it, through rich.style)
def load_policy(path: str | Path, device: str = "cpu"):
    """``(policy, metadata)``: the SB3 policy saved at ``path``, rebuilt from its JSON file.

    The policy is an ``ActorCriticPolicy`` (PPO, A2C) or a ``DQNPolicy`` (DQN). See the module
    docstring for what is read. Raises ``ValueError`` naming the file for a missing or malformed
    JSON file, a zip without ``policy.pth``, weights that are not plain tensors (a pickle naming any
    other object is refused before it runs), or weights that do not fit the architecture the JSON
    describes.
    """
    import torch
    from gymnasium import spaces

    check_device(device)  # before the weights: a bad device is not a bad file
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
    kwargs: dict[str, Any] = {
        "net_arch": pol["net_arch"],
        "activation_fn": getattr(torch.nn, pol["activation_fn"]),
        "normalize_images": pol["normalize_images"],
    }
    if pol["class"] == "ActorCriticPolicy":
        kwargs["share_features_extractor"] = pol["share_features_extractor"]
    policy_class = _policy_classes()[pol["class"]]
    # The weights (size-limited) first: a JSON within its limits can still describe a network of many
    # GB, which must not be allocated only to find that the weights cannot fill it.
    state = _read_weights(path, device)
    held, needed = sum(t.numel() for t in state.values()), _least_parameters(meta)
    if needed > held:
        raise ValueError(
            f"{path}: the weights do not fit the architecture in {metadata_path(path).name} (it needs at least "
            f"{needed} parameters, {WEIGHTS_ENTRY} holds {held})"
        )
    # no optimiser steps: the policy only acts; its initial weights (replaced by the file's next) are drawn from
    # a fork of the CPU generator, so loading a policy leaves the caller's random stream where it was
    with torch.random.fork_rng(devices=[]):
        policy = policy_class(observation_space, _action_space(meta), lr_schedule=lambda _: 0.0, **kwargs)
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
    """Acts with a saved SB3 policy (see :func:`load_policy`). ``deterministic=False`` samples from the
    policy's action distribution with the ``rng`` that ``act`` is given (the environment's opponent
    generator, seeded by ``reset(seed=...)``), so a stochastic opponent replays with its seed; DQN
    policies always act greedily.

    With ``role`` and ``scenario`` the policy is checked before use: it must have been trained for
    that role, with that role's action space in the scenario; observations are checked on each call.
    A flat (``Discrete``) policy plays in ``MultiDiscrete`` spaces and the reverse (see the module
    docstring), so a policy trained with ``flat_actions=True`` is an opponent like any other.
    """

    episodic = True  # a frozen policy

    def __init__(
        self,
        path: str | Path,
        *,
        role: str | None = None,
        scenario: Any = None,
        deterministic: bool = True,
        device: str = "cpu",
    ) -> None:
        from gymnasium import spaces

        self.path = Path(path)
        self.policy, self.metadata = load_policy(self.path, device=device)
        self.algo: str = self.metadata["algo"]
        self.deterministic = deterministic
        self.name = f"{self.algo}:{path}"
        self.flat = isinstance(self.policy.action_space, spaces.Discrete)
        #: the MultiDiscrete menu a flat policy flattens, when its file records it
        nvec = self.metadata["action_space"].get("nvec")
        self.flat_nvec = np.asarray(nvec, np.int64) if self.flat and nvec is not None else None
        trained_as = self.metadata["role"]
        if role is not None and role != trained_as:
            raise ValueError(f"policy {str(self.path)!r} was trained as the {trained_as}; it cannot play the {role}")
        if scenario is not None:
            nvec = np.asarray(getattr(scenario, f"{role or trained_as}_nvec"))
            self._check_action_nvec(nvec, f"the {role or trained_as}'s action space in this scenario")

    def _describe(self) -> str:
        keys = ("env_id", "role", "overrides")
        return ", ".join(f"{k}={self.metadata[k]!r}" for k in keys if k in self.metadata)

    def _trained_space(self) -> str:
        space = self.policy.action_space
        if not self.flat:
            return f"MultiDiscrete({np.asarray(space.nvec).tolist()})"
        menu = "" if self.flat_nvec is None else f", the flattened MultiDiscrete({self.flat_nvec.tolist()})"
        return f"Discrete({int(space.n)}{menu})"

    def _check_action_nvec(self, nvec: np.ndarray, what: str) -> None:
        if self.flat:
            ok = nvec.ndim == 1 and int(np.prod(nvec)) == int(self.policy.action_space.n) and (
                self.flat_nvec is None or np.array_equal(self.flat_nvec, nvec)
            )
        else:
            want = np.asarray(self.policy.action_space.nvec)
            ok = want.shape == nvec.shape and np.array_equal(want, nvec)
        if not ok:
            raise ValueError(
                f"policy {str(self.path)!r} acts in {self._trained_space()}, but {what} is "
                f"MultiDiscrete({nvec.tolist()}): it was trained on another scenario or role ({self._describe()})"
            )

    def check_spaces(self, observation_space, action_space) -> None:
        """Raise ``ValueError`` when the policy was trained on different spaces than it is given."""
        self._check(tuple(observation_space.shape), action_space)

    def _check(self, observation_shape: tuple, action_space) -> None:
        from gymnasium import spaces

        want_obs = self.policy.observation_space.shape
        if observation_shape != tuple(want_obs):
            raise ValueError(
                f"policy {str(self.path)!r} expects observations of shape {want_obs}, got "
                f"{observation_shape}: it was trained on another scenario or role ({self._describe()})"
            )
        if isinstance(action_space, spaces.Discrete):
            n = int(action_space.n)
            size = int(self.policy.action_space.n) if self.flat else int(np.prod(self.policy.action_space.nvec))
            if n != size:
                raise ValueError(
                    f"policy {str(self.path)!r} acts in {self._trained_space()} ({size} actions), but this role's "
                    f"action space is {action_space}: it was trained on another scenario or role ({self._describe()})"
                )
            return
        self._check_action_nvec(np.asarray(getattr(action_space, "nvec", None)), f"this role's action space {action_space}")

    def _sample(self, observation: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw from the policy's (multi-)categorical action distribution with ``rng`` -- not SB3's
        ``predict(deterministic=False)``, which samples from torch's global RNG."""
        import torch

        obs, _ = self.policy.obs_to_tensor(observation)
        with torch.no_grad():
            dist = self.policy.get_distribution(obs).distribution
        parts = dist if isinstance(dist, list) else [dist]  # MultiCategorical: one Categorical per entry
        choice = []
        for part in parts:
            p = part.probs[0].double().cpu().numpy()
            choice.append(int(rng.choice(p.size, p=p / p.sum())))
        return np.asarray(choice if isinstance(dist, list) else choice[0])

    def get_state(self) -> None:
        """Nothing to save: ``act`` changes nothing on the agent (and the loaded policy is not copied)."""

    def set_state(self, state: None) -> None:
        """Nothing to restore (:meth:`get_state`)."""

    def act(self, observation, action_space, rng):
        from gymnasium import spaces

        self._check(tuple(np.shape(observation)), action_space)
        obs = np.asarray(observation, dtype=np.float32)
        if self.deterministic or not hasattr(self.policy, "get_distribution"):  # DQN: greedy
            action, _ = self.policy.predict(obs, deterministic=True)
        else:
            action = self._sample(obs, rng)
        action = np.asarray(action, dtype=np.int64)
        if isinstance(action_space, spaces.Discrete):
            if self.flat:
                return action.reshape(())
            return np.asarray(np.ravel_multi_index(tuple(action), tuple(self.policy.action_space.nvec)), np.int64)
        if self.flat:
            return np.asarray(np.unravel_index(int(action), tuple(action_space.nvec)), dtype=np.int64)
        return action


__all__ = [
    "ACTIVATIONS",
    "ALGORITHMS",
    "POLICY_CLASSES",
    "POLICY_FORMAT",
    "LearnedAgent",
    "algorithm_class",
    "load_policy",
    "metadata_path",
    "policy_spec",
    "read_metadata",
    "save_policy",
]

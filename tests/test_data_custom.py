"""Bring your own data (leakgym.data.custom): an image folder or an .npz wherever a dataset name goes.

Every test writes its own small files; refusals are checked to be one line naming the path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from leakgym.data import dataset_spec, load_dataset
from leakgym.data.custom import USER_TEST_FRACTION, user_data
from leakgym.game.scenario import Scenario, load_scenario


def _folder(root: Path, counts: dict[str, int], shape=(10, 12, 3), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for name, n in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            Image.fromarray(pixels.squeeze(-1) if shape[-1] == 1 else pixels).save(root / name / f"{i:03d}.png")
    return root


def _npz(path: Path, n=30, shape=(8, 8), num_classes=3, seed=0, **extra) -> Path:
    rng = np.random.default_rng(seed)
    arrays = {"images": rng.integers(0, 256, (n, *shape), dtype=np.uint8), "labels": np.arange(n) % num_classes}
    arrays.update(extra)
    np.savez(path, **arrays)
    return path


def _one_line_naming(exc: pytest.ExceptionInfo, path: Path) -> str:
    message = str(exc.value)
    assert "\n" not in message and str(path) in message, message
    return message


def test_a_folder_gives_channels_classes_split_and_statistics_from_its_images(tmp_path):
    root = _folder(tmp_path / "pets", {"cat": 10, "dog": 6, "eel": 5})
    data = load_dataset(str(root))
    spec = data.spec
    assert (spec.name, spec.channels, spec.num_classes, spec.image_size) == (str(root), 3, 3, 10)  # 10x12 -> 10
    # the fixed split holds out round(0.2 * n_c) images of every class
    assert torch.bincount(data.test_y, minlength=3).tolist() == [round(USER_TEST_FRACTION * n) for n in (10, 6, 5)]
    assert torch.bincount(data.train_y, minlength=3).tolist() == [8, 5, 4]
    # every training image is one of the files of its class, centre-cropped (12 -> 10 columns), label = folder
    files = {c: [np.asarray(Image.open(p)) for p in sorted((root / c).iterdir())] for c in ("cat", "dog", "eel")}
    for x, y in zip(data.train_x, data.train_y):
        pixels = (x.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        assert any(np.array_equal(pixels, f[:, 1:11]) for f in files[("cat", "dog", "eel")[int(y)]])
    # the statistics are those of the training images at native resolution
    raw = user_data(root)
    train = raw.train_x.astype(np.float64) / 255
    np.testing.assert_allclose(spec.mean, train.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(spec.std, train.std(axis=(0, 2, 3)), rtol=1e-9)
    assert dataset_spec(str(root), image_size=16) == dataset_spec(str(root)).__class__(
        name=str(root), channels=3, image_size=16, num_classes=3, mean=spec.mean, std=spec.std)
    assert load_dataset(str(root), image_size=16).train_x.shape[1:] == (3, 16, 16)


def test_a_folder_is_read_once_and_again_when_it_changes(tmp_path):
    root = _folder(tmp_path / "d", {"a": 5, "b": 5})
    first = user_data(root)
    assert user_data(str(root)) is first  # cached with its split
    _folder(root, {"c": 5}, seed=1)
    again = user_data(root)
    assert again is not first and again.classes == ("a", "b", "c")


def test_a_folder_with_train_and_val_keeps_its_own_split(tmp_path):
    root = tmp_path / "split"
    _folder(root / "train", {"x": 4, "y": 3}, shape=(9, 9, 1))
    _folder(root / "val", {"y": 2}, shape=(9, 9, 1), seed=2)
    data = load_dataset(str(root))
    assert data.spec.channels == 1 and data.train_y.tolist().count(0) == 4 and data.test_y.tolist() == [1, 1]


@pytest.mark.parametrize("where", ["", "train", "val"])
def test_loose_images_in_a_train_val_folder_are_refused_as_in_the_flat_layout(tmp_path, where):
    """Found in an audit: images beside the class folders of train/ or val/ (or beside train/ and val/) were
    ignored without a word, where the flat layout refuses them."""
    root = tmp_path / "split"
    _folder(root / "train", {"x": 4, "y": 3}, shape=(9, 9, 1))
    _folder(root / "val", {"y": 2}, shape=(9, 9, 1), seed=2)
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(root / where / "loose.png")
    with pytest.raises(ValueError, match="'loose.png', ... lie beside the class sub-folders") as exc:
        load_dataset(str(root))
    _one_line_naming(exc, root / where)


def test_an_npz_gives_grey_or_colour_images_and_its_own_split(tmp_path):
    grey = load_dataset(str(_npz(tmp_path / "g.npz")))
    assert grey.spec.shape == (1, 8, 8) and grey.spec.num_classes == 3 and len(grey.test_y) == 6
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "c.npz", images=rng.integers(0, 256, (10, 6, 6, 3), dtype=np.uint8), labels=np.arange(10) % 2,
             test_images=rng.integers(0, 256, (3, 6, 6, 3), dtype=np.uint8), test_labels=np.array([0, 1, 4]),
             classes=np.array(["a", "b", "c", "d", "e"]))
    data = load_dataset(str(tmp_path / "c.npz"))
    assert data.spec.shape == (3, 6, 6) and data.spec.num_classes == 5
    assert data.test_y.tolist() == [0, 1, 4] and len(data.train_y) == 10
    with np.load(tmp_path / "c.npz") as z:  # images are the stored pixels, channels first
        torch.testing.assert_close(data.train_x[3], torch.from_numpy(z["images"][3]).permute(2, 0, 1).float() / 255)


@pytest.mark.parametrize("case, expected", [
    ("one class", "one class ('only')"),
    ("mixed shapes", "mixed image shapes"),
    ("mixed channels", "mixed image shapes"),
    ("too few", "too few images for the split"),
    ("empty class", "class folder holds no images"),
    ("loose images", "lie beside the class sub-folders"),
    ("no classes", "holds images but no class sub-folders"),
    ("not an image", "not a readable image"),
    ("constant", "has the same value; the images cannot be normalised"),
    ("loose bmp", "lie beside the class sub-folders"),
])
def test_bad_folders_are_refused_in_one_line_naming_the_path(tmp_path, case, expected):
    root = tmp_path / "bad"
    if case == "one class":
        _folder(root, {"only": 5})
    elif case == "mixed shapes":
        _folder(root, {"a": 3})
        _folder(root, {"b": 3}, shape=(10, 11, 3))
    elif case == "mixed channels":
        _folder(root, {"a": 3})
        _folder(root, {"b": 3}, shape=(10, 12, 1))
    elif case == "too few":
        _folder(root, {"a": 1, "b": 2})  # round(0.2 * 1) = round(0.4) = 0 test images
    elif case == "empty class":
        _folder(root, {"a": 3})
        (root / "b").mkdir()
    elif case == "loose images":
        _folder(root, {"a": 3, "b": 3})
        Image.new("RGB", (4, 4)).save(root / "stray.png")
    elif case == "no classes":
        root.mkdir()
        Image.new("RGB", (4, 4)).save(root / "stray.png")
    elif case == "constant":
        for c in ("a", "b"):
            (root / c).mkdir(parents=True)
            for i in range(5):
                Image.new("L", (6, 6), 128).save(root / c / f"{i}.png")
    elif case == "loose bmp":
        _folder(root, {"a": 3, "b": 3})
        Image.new("RGB", (4, 4)).save(root / "stray.bmp")
    else:
        _folder(root, {"a": 3, "b": 3})
        (root / "b" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError) as exc:
        load_dataset(str(root))
    assert expected in _one_line_naming(exc, root)


def test_bad_npz_files_are_refused_in_one_line_naming_the_file(tmp_path):
    cases = {
        "negative.npz": {"labels": np.array([0, 1, -1] * 10)},
        "range.npz": {"classes": np.array(["a", "b"])},  # labels 0..2 for 2 classes
        "float.npz": {"images": np.zeros((30, 8, 8), np.float32)},
        "count.npz": {"labels": np.arange(29) % 3},
        "fourch.npz": {"images": np.zeros((30, 8, 8, 4), np.uint8)},
        "oneclass.npz": {"labels": np.zeros(30, np.int64)},
        "floatlabels.npz": {"labels": np.arange(30) % 3 * 1.0},
        # found in an audit: a uint64 label past 2**63 became -1 and its image was dropped; one huge label made
        # a class per integer up to it (out of memory); timedelta64 labels passed as integers
        "wrapped.npz": {"labels": np.array([0, 1, 2] * 9 + [0, 1, 2**64 - 1], dtype=np.uint64)},
        "huge.npz": {"labels": np.array([0, 1, 2] * 9 + [0, 1, 2**40])},
        "timedelta.npz": {"labels": (np.arange(30) % 3).astype("m8[s]")},
        "onepixel.npz": {"images": np.random.default_rng(0).integers(0, 256, (30, 1, 1), dtype=np.uint8)},
    }
    expected = {"negative.npz": "labels out of range", "range.npz": "labels out of range: label 2 for 2 classes",
                "float.npz": "must be uint8", "count.npz": "one label per image", "fourch.npz": "C = 1 or 3",
                "oneclass.npz": "one class", "floatlabels.npz": "must be integers",
                "wrapped.npz": "holds 18446744073709551615; allowed: integers in [0, 99999]",
                "huge.npz": "holds 1099511627776; allowed", "timedelta.npz": "must be integers",
                "onepixel.npz": "images of 1x1 pixels; allowed: at least 2x2"}
    for name, extra in cases.items():
        path = _npz(tmp_path / name, **extra)
        with pytest.raises(ValueError) as exc:
            load_dataset(str(path))
        assert expected[name] in _one_line_naming(exc, path), name
    np.savez(tmp_path / "nolabels.npz", images=np.zeros((3, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="missing array") as exc:
        load_dataset(str(tmp_path / "nolabels.npz"))
    _one_line_naming(exc, tmp_path / "nolabels.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 damaged")
    with pytest.raises(ValueError, match="not a readable .npz") as exc:
        load_dataset(str(tmp_path / "junk.npz"))
    _one_line_naming(exc, tmp_path / "junk.npz")


class _Payload:
    """Un-pickling this object would create the file named in ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_nothing_in_an_npz_is_unpickled(tmp_path):
    target = tmp_path / "ran"
    labels = np.empty(30, dtype=object)
    labels[:] = [_Payload(str(target))] * 30
    path = tmp_path / "hostile.npz"
    np.savez(path, images=np.zeros((30, 4, 4), np.uint8), labels=labels)  # object arrays are pickled
    with pytest.raises(ValueError, match="without un-pickling") as exc:
        load_dataset(str(path))
    _one_line_naming(exc, path)
    assert not target.exists()


def test_an_npz_entry_that_is_not_a_npy_array_is_refused_by_name(tmp_path):
    """Found in an audit: numpy hands back the raw bytes of a zip entry without a .npy header (junk, or a
    pickle), and the dataset checks failed on them with an AttributeError. Nothing is un-pickled."""
    import pickle
    import zipfile

    target = tmp_path / "ran"
    for name, entry in (("junk.npz", b"hello"), ("pickled.npz", pickle.dumps(_Payload(str(target))))):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("images.npy", entry)
            z.writestr("labels.npy", entry)
        with pytest.raises(ValueError, match=r"\['images', 'labels'\] are not .npy arrays") as exc:
            load_dataset(str(path))
        _one_line_naming(exc, path)
    assert not target.exists()


def test_missing_paths_and_unknown_names_are_refused(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match="no such folder or .npz file") as exc:
        load_dataset(str(missing))
    _one_line_naming(exc, missing)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="must be an .npz archive"):
        load_dataset(str(tmp_path / "x.txt"))
    with pytest.raises(ValueError, match=r"scenario 'digits': dataset: .*nowhere: no such folder"):
        Scenario(dataset=str(missing))
    with pytest.raises(ValueError, match="dataset='cifar'; allowed: .*did you mean 'cifar10'.*or a path to an image folder"):
        Scenario(dataset="cifar")


def test_the_dataset_option_takes_a_path_as_keyword_toml_key_and_cli_override(tmp_path, capsys):
    from leakgym.agents.experiments.cli_common import parse_overrides
    from leakgym.cli import main

    root = _folder(tmp_path / "faces", {"young": 6, "old": 6}, shape=(12, 12, 3))
    assert Scenario(dataset=root, image_size=None, num_clients=2).dataset == str(root)  # a Path too
    toml = tmp_path / "mine.toml"
    toml.write_text(f'name = "mine"\ndataset = "{root}"\nimage_size = 12\nnum_clients = 2\n')
    assert load_scenario(toml).dataset == str(root)
    assert load_scenario("digits", **parse_overrides([f"dataset={root}", "num_clients=2"])).dataset == str(root)
    # describe shows what came from the data
    assert main(["describe", "LeakGym-Digits-v0", "--overrides", f"dataset={root}", "image_size=12",
                 "num_clients=2"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("dataset:"))
    assert f"dataset: {root}: 3 channel(s), 12x12 px, 2 classes, 10 training images" in line
    # a bad folder is a user error: one line, exit status 2
    _folder(root, {"odd": 2}, shape=(5, 5, 3))
    assert main(["describe", "LeakGym-Digits-v0", "--overrides", f"dataset={root}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leakgym: error: ") and "mixed image shapes" in err and str(root) in err
    assert len(err.strip().splitlines()) == 1


def test_a_scenario_refuses_a_split_the_data_cannot_fill(tmp_path):
    root = _folder(tmp_path / "small", {"a": 5, "b": 5})  # 8 training images
    with pytest.raises(ValueError, match=rf"num_clients=9 .* leaves 4 of the 8 training images of {root}$"):
        Scenario(dataset=str(root), num_clients=9, public_fraction=0.5, image_size=None)
    with pytest.raises(ValueError, match=rf"leaves no public image of the 8 training images of {root}"):
        Scenario(dataset=str(root), num_clients=1, image_size=None)


@pytest.mark.parametrize("kind", ["folder", "npz"])
def test_a_game_plays_on_the_users_data(tmp_path, cheap_overrides, kind):
    from leakgym.envs import parallel_env

    if kind == "folder":
        path = _folder(tmp_path / "imgs", {"a": 8, "b": 8, "c": 8}, shape=(12, 12, 3))
        shape = (3, 12, 12)
    else:
        path = _npz(tmp_path / "d.npz", n=40, shape=(10, 10), num_classes=4)
        shape = (1, 10, 10)
    env = parallel_env("digits", dataset=str(path), image_size=None, **cheap_overrides)
    _observations, _ = env.reset(seed=0)
    games = env.unwrapped.games
    assert games.spec.shape == shape and games.spec.name == str(path)
    assert games.model(0)(torch.zeros(1, *shape)).shape[-1] == games.spec.num_classes  # the model adapted
    actions = {agent: env.action_space(agent).sample() for agent in env.agents}
    _, rewards, _, _, infos = env.step(actions)
    assert set(rewards) == {"attacker", "defender"} and env.round == 1
    assert all(np.isfinite(r) for r in rewards.values())
    assert -1.0 <= infos["attacker"]["leakage_ssim"] <= 1.0 and 0.0 <= infos["attacker"]["leakage"] <= 1.0
    env.close()


def test_paths_are_told_from_names():
    from leakgym.data.catalog import is_dataset_path

    assert not is_dataset_path("mnist") and not is_dataset_path("svhn")
    assert is_dataset_path("./mnist") and is_dataset_path("a/b") and is_dataset_path("x.npz")
    assert is_dataset_path("~/data") and not is_dataset_path("no-such-dataset-name")


def test_a_folder_behind_a_link_is_read_again_when_it_changes(tmp_path):
    """Found in an audit: the cache key (leakgym.data.folders.tree_fingerprint) did not enter linked folders,
    which the readers follow: images added behind a linked class folder, or the link pointed at another copy,
    were not seen again in the same process (nor by the decoded-image cache of the named datasets)."""
    store = _folder(tmp_path / "store", {"x": 4, "y": 5}, shape=(8, 8, 1))
    root = tmp_path / "data"
    root.mkdir()
    for name in ("x", "y"):
        (root / name).symlink_to(store / name, target_is_directory=True)
    assert len(load_dataset(str(root)).train_y) + len(load_dataset(str(root)).test_y) == 9
    for i in range(3, 9):
        Image.fromarray(np.full((8, 8), i, np.uint8)).save(store / "x" / f"new{i}.png")
    data = load_dataset(str(root))
    assert len(data.train_y) + len(data.test_y) == 15
    (root / "y" / "loop").symlink_to(root, target_is_directory=True)  # a link loop is counted once, not followed for ever
    from leakgym.data.folders import tree_fingerprint

    assert tree_fingerprint(root)

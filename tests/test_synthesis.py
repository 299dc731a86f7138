"""The vectorised synthesis (versions 2 and 3) paths give the same bytes for any range, labels and
shapes hold, each dataset keeps its learnable signal, imagenet sizes look like ILSVRC-2012,
and the manifest records the version (an old dataset is never silently mixed with a new one)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import cli
from iobench import generators
from iobench.core.datasets import DATASETS
from iobench.core.manifest import MANIFEST_NAME, Manifest
from iobench.generators import synth
from iobench.generators.verify import verify_dataset
from iobench.workflows.generate import GenerateConfig, generate_dataset


@pytest.mark.parametrize("dataset, ranges", [
    ("cifar10", [(0, 3000), (1020, 10), (2047, 2), (4095, 3)]),
    ("cosmoflow", [(0, 3), (2, 1)]),
])
def test_fill_samples_same_bytes_for_any_range(dataset, ranges):
    spec = DATASETS[dataset]
    ref: dict[int, np.ndarray] = {}
    for first, count in ranges:
        out = np.empty((count, *spec.sample_shape), dtype=spec.sample_dtype)
        synth.fill_samples(spec, 7, first, out)
        for j in range(count):
            i = first + j
            if i in ref:
                assert np.array_equal(ref[i], out[j]), f"sample {i} differs between ranges"
            ref[i] = out[j].copy()
    for i in (0, 2, ranges[-1][0]):  # the per-sample ground truth agrees with the blocks
        payload, label = synth.make_sample(spec, 7, i)
        assert payload.shape == spec.sample_shape and payload.dtype == spec.sample_dtype
        assert np.array_equal(payload, ref[i])
        assert np.array_equal(np.asarray(label), np.asarray(synth.make_label(spec, 7, i)))


@pytest.mark.parametrize("dataset", ["cifar10", "imagenet", "cosmoflow", "openimages", "unet3d"])
def test_labels_blockwise_match_per_sample(dataset):
    spec = DATASETS[dataset]
    first = synth.LABEL_BLOCK - 5  # across a block boundary
    labels = synth.labels_array(spec, 3, first, 10)
    assert labels.shape == (10, *spec.label_shape) and labels.dtype == spec.label_dtype
    for j in range(10):
        assert np.array_equal(labels[j], np.asarray(synth.make_label(spec, 3, first + j)))
    if spec.num_classes:
        many = synth.labels_array(spec, 3, 0, 4000)
        assert many.min() >= 0 and many.max() < spec.num_classes
        assert len(np.unique(many)) == min(spec.num_classes, 4000) or spec.num_classes > 100
    else:
        assert (labels >= 0).all() and (labels < 1).all()
    other = synth.labels_array(spec, 4, first, 10)
    assert not np.array_equal(labels, other)  # the seed matters


def test_imagenet_planes_are_what_is_encoded():
    import simplejpeg

    spec = DATASETS["imagenet"]
    y, cb, cr = synth.imagenet_planes(spec, 0, 5)
    blob, _ = synth.make_sample(spec, 0, 5)
    assert blob == simplejpeg.encode_jpeg_yuv_planes(y, cb, cr, quality=synth.JPEG_QUALITY)
    assert y.dtype == np.uint8 and y.shape == cb.shape == cr.shape  # 4:4:4
    assert simplejpeg.decode_jpeg_header(blob)[:2] == y.shape


def test_openimages_are_imagenet_pictures_scaled_up_to_a_capped_side():
    """openimages (retinanet): imagenet's mixture at 1.85x the side, long side <= 1,600 px,
    so the typical image (imagenet's 500 px long side) is 925 px long; the same encoder."""
    import simplejpeg

    def shapes(name):
        return np.array([synth.imagenet_planes(DATASETS[name], 0, i)[0].shape
                         for i in range(200)])

    big, small = shapes("openimages"), shapes("imagenet")
    assert big.max() <= 1600 and big.min() >= 32
    assert np.median(small.max(axis=1)) == 500 and np.median(big.max(axis=1)) == 925
    blob, _ = synth.make_sample(DATASETS["openimages"], 0, 1)
    assert simplejpeg.decode_jpeg_header(blob)[:2] == tuple(big[1])


def test_imagenet_dimensions_follow_the_documented_mixture():
    rng = np.random.default_rng(0)
    hw = np.array([synth._imagenet_size(rng) for _ in range(20000)])
    long_side = hw.max(axis=1)
    assert abs(hw[:, 1].mean() - 469) < 0.05 * 469  # mean width (ILSVRC-2012: 469)
    assert abs(hw[:, 0].mean() - 387) < 0.06 * 387  # mean height (387)
    assert 0.80 < (long_side == 500).mean() < 0.92  # most images: 500 px long side
    assert 0.01 < (long_side > 500).mean() < 0.05  # a long tail of large images
    assert long_side.max() <= 4288 and (long_side > 2000).any()
    assert hw.min() >= 32


def test_imagenet_jpeg_sizes_within_documented_bounds():
    import simplejpeg

    spec = DATASETS["imagenet"]
    sizes, long_sides = [], []
    for i in range(300):
        blob, _ = synth.make_sample(spec, 0, i)
        sizes.append(len(blob))
        long_sides.append(max(simplejpeg.decode_jpeg_header(blob)[:2]))
    s, long_side = np.asarray(sizes, dtype=np.float64), np.asarray(long_sides)
    assert 85_000 < s.mean() < 140_000  # ILSVRC-2012: ~110 KB
    assert 60_000 < np.median(s) < 120_000
    assert np.percentile(s, 5) > 15_000 and s.std() > 30_000
    assert (long_side > 500).any() and long_side.max() <= 4288  # large images exist
    assert s.max() > 4 * np.median(s)  # the long tail of large files


def _grating_power(power: np.ndarray, cycles: int, angle: int) -> float:
    """Spectral power (rfft2 of the luminance) near a grating of `cycles` across the image
    at 18 deg * `angle`."""
    kx = cycles * math.cos(math.radians(18 * angle))
    ky = cycles * math.sin(math.radians(18 * angle))
    if kx < 0:  # rfft2 keeps kx >= 0; (kx, ky) and (-kx, -ky) are the same wave
        kx, ky = -kx, -ky
    bx, by = int(round(kx)), int(round(ky))
    h, wk = power.shape
    return float(sum(power[(by + dy) % h, min(max(bx + dx, 0), wk - 1)]
                     for dy in (-1, 0, 1) for dx in (-1, 0, 1)))


def test_imagenet_class_signal_is_measurable():
    """Tint from the mean colour, grating angle from the spectrum: far above chance (10 %)."""
    import simplejpeg

    spec = DATASETS["imagenet"]
    hues = np.stack([np.cos(2 * np.pi * (np.array([0, 2 / 3, 1 / 3]) + k / 10))
                     for k in range(10)])
    tint_ok = angle_ok = n = 0
    for i in range(200):
        blob, c = synth.make_sample(spec, 0, i)
        rgb = simplejpeg.decode_jpeg(blob).astype(np.float32)
        h, w = rgb.shape[:2]
        if max(h, w) > 500:
            continue
        n += 1
        mean = rgb.reshape(-1, 3).mean(0)
        tint_ok += int(np.argmax(hues @ (mean - mean.mean())) == c % 10)
        lum = rgb.mean(2)
        power = np.abs(np.fft.rfft2(lum - lum.mean())) ** 2
        energy = [_grating_power(power, 3 + c // 100, a) for a in range(10)]
        angle_ok += int(np.argmax(energy) == (c // 10) % 10)
    assert n > 150
    assert tint_ok / n > 0.3  # measured 0.46 (as synthesis version 1)
    assert angle_ok / n > 0.6  # measured 0.8


def _log_sigma(channel: np.ndarray) -> tuple[float, float]:
    """Mean and log-normal sigma of a count channel (rounding variance removed)."""
    x = channel.astype(np.float64)
    m = x.mean()
    return m, math.sqrt(math.log1p((x.var() - 1 / 12) / m ** 2))


def _spectral_slope(channel: np.ndarray) -> float:
    d = np.log(np.maximum(channel.astype(np.float32), 0.5))
    power = np.abs(np.fft.rfftn(d - d.mean())) ** 2
    n = channel.shape[0]
    f, fr = np.fft.fftfreq(n) * n, np.fft.rfftfreq(n) * n
    k = np.rint(np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2
                        + fr[None, None, :] ** 2)).astype(int)
    sel = (k >= 2) & (k <= 16)
    pk = np.bincount(k[sel], power[sel]) / np.maximum(np.bincount(k[sel]), 1)
    ks = np.nonzero(pk)[0]
    return float(np.polyfit(np.log(ks), np.log(pk[ks]), 1)[0])


def test_cosmoflow_parameters_recoverable_from_simple_statistics():
    spec = DATASETS["cosmoflow"]
    for i in range(3):
        x, u = synth.make_sample(spec, 0, i)
        assert x.shape == (128, 128, 128, 4) and x.dtype == np.int16 and u.dtype == np.float32
        sigma8, slope = 0.6 + 0.4 * u[0], -2.6 + 1.2 * u[1]
        growth, nbar = 0.5 + 0.5 * u[2], 20 + 40 * u[3]
        m3, s3 = _log_sigma(x[..., 3])
        _, s0 = _log_sigma(x[..., 0])
        assert abs(m3 - nbar) < 0.02 * nbar  # mean count
        assert abs(s3 - sigma8) < 0.03  # amplitude of the field
        assert abs((s0 / s3) ** (1 / 3) - growth) < 0.03  # growth from channel 0 to 3
        assert abs(_spectral_slope(x[..., 3]) - slope) < 0.3  # power-spectrum slope


def _cifar10_reference(spec, seed: int, block: int) -> np.ndarray:
    """cifar10 synthesis version 3 of one block, the plain way: each sample's channel
    planes summed on their own (int16 fixed point), noise read from the planar table."""
    b = synth.CIFAR_BLOCK
    labels = synth.labels_array(spec, seed, block * b, b)
    rng = np.random.default_rng([seed, synth.DATASET_IDS["cifar10"], 2, block])
    phase = rng.integers(0, 64, b)
    amp = rng.integers(25, 51, (b, 1), dtype=np.int16)
    centre, width = rng.uniform(0.2, 0.8, (b, 2)), rng.uniform(0.01, 0.04, (b, 1))
    colour = rng.uniform(-60, 60, (b, 3))
    base = np.rint(synth._CIFAR_PALETTE[labels] * rng.uniform(0.7, 1.1, (b, 1))).astype(np.int16)
    offsets = rng.integers(0, 1 << 20, b)
    noise_rng = np.random.default_rng([seed, synth.DATASET_IDS["cifar10"], 3, 0])
    noise = np.clip(np.rint(noise_rng.standard_normal((1 << 20) + 3072, dtype=np.float32)
                            * np.float32(18.0)), -127, 127).astype(np.int16)
    y, x = np.mgrid[0:32, 0:32].astype(np.float64) / 32.0
    t = np.arange(32) / 32.0
    out = np.empty((b, 32, 32, 3), dtype=np.uint8)
    for i in range(b):
        c = int(labels[i])
        theta = np.radians(18.0 * c)
        arg = (2 * np.pi * (2 + c % 3) * (x * np.cos(theta) + y * np.sin(theta))
               + 2 * np.pi * phase[i] / 64)
        grating = (np.rint(np.sin(arg) * 64).astype(np.int16) * amp[i]) >> 6
        by = np.rint(np.exp(-(t - centre[i, 0]) ** 2 / (2 * width[i])) * 127).astype(np.int16)
        bx = np.exp(-(t - centre[i, 1]) ** 2 / (2 * width[i]))
        for ch in range(3):
            col = np.rint(bx * colour[i, ch]).astype(np.int16)
            plane = (by[:, None] * col[None, :]) >> 7
            plane = plane + grating + base[i, ch] + noise[offsets[i] + ch * 1024:][:1024].reshape(32, 32)
            out[i, :, :, ch] = np.clip(plane, 0, 255)
    return out


@pytest.mark.parametrize("block", [0, 5])
def test_cifar10_fast_path_is_the_plain_recipe(block):
    # the synthesis works in HWC order from interleaved tables: the bytes must stay those of
    # each sample's channel planes summed on their own (synthesis version 3)
    spec = DATASETS["cifar10"]
    b = synth.CIFAR_BLOCK
    out = np.empty((b, 32, 32, 3), dtype=np.uint8)
    synth.fill_samples(spec, 11, block * b, out)
    assert np.array_equal(out, _cifar10_reference(spec, 11, block))


def _cosmoflow_reference(spec, seed: int, index: int) -> np.ndarray:
    """Synthesis version 2 of one cosmoflow volume, written the plain way (fresh arrays,
    `irfftn`, `clip`, fancy indexing): the recipe of the synth module's docstring."""
    n = spec.sample_shape[0]
    u = synth.make_label(spec, seed, index)
    sigma8, slope = 0.6 + 0.4 * float(u[0]), -2.6 + 1.2 * float(u[1])
    growth, nbar = 0.5 + 0.5 * float(u[2]), 20.0 + 40.0 * float(u[3])
    f, fr = np.fft.fftfreq(n) * n, np.fft.rfftfreq(n) * n
    k2 = f[:, None, None] ** 2 + f[None, :, None] ** 2 + fr[None, None, :] ** 2
    k2[0, 0, 0] = 1.0
    logk = (0.5 * np.log(k2)).astype(np.float32)
    a = 2 * np.pi * np.arange(256) / 256
    phases = (np.cos(a) + 1j * np.sin(a)).astype(np.complex64)
    draws = synth.sample_rng(spec, seed, index).integers(0, 256, logk.shape, dtype=np.uint8)
    amp = np.exp(logk * np.float32(slope / 2.0))
    amp[0, 0, 0] = 0.0
    delta = np.fft.irfftn(phases[draws] * amp, s=(n, n, n), axes=(0, 1, 2))
    assert delta.dtype == np.float32
    flat = delta.reshape(-1)
    rms = math.sqrt(float(np.dot(flat, flat)) / flat.size)
    idx = np.clip(flat * np.float32(1024.0 / (rms + 1e-30)) + np.float32(8192 + 0.5), 0,
                  16383).astype(np.intp)
    level = (np.arange(16384) - 8192) / 1024.0 * sigma8
    g = growth ** (3.0 - np.arange(4))
    table = np.rint(nbar * np.exp(level[:, None] * g - g * g * (sigma8 * sigma8) / 2.0))
    return np.clip(table, 0, 32767).astype(np.int16)[idx].reshape(n, n, n, 4)


@pytest.mark.parametrize("dataset, index", [("cosmoflow-mlperf", 3), ("cosmoflow", 1)])
def test_cosmoflow_fast_path_is_the_plain_recipe(dataset, index):
    # the synthesis reuses its buffers, runs irfftn's steps in place and skips numpy's
    # out-buffering: the bytes must stay those of the plain recipe (synthesis version 2)
    spec = DATASETS[dataset]
    out = np.empty((2, *spec.sample_shape), dtype=spec.sample_dtype)
    synth.fill_samples(spec, 5, index, out)  # two volumes through the same work buffers
    assert np.array_equal(out[0], _cosmoflow_reference(spec, 5, index))
    assert np.array_equal(out[1], _cosmoflow_reference(spec, 5, index + 1))


def test_manifest_records_synthesis_version(tmp_path):
    m = generate_dataset(GenerateConfig(dataset="cifar10", format="hdf5", storage=tmp_path,
                                        samples=20))
    assert m.extra.get("synthesis_version") == synth.synthesis_version_of("cifar10") == 3
    assert generators.synthesis_version(m) == 3
    doc = json.loads((m.root / MANIFEST_NAME).read_text())
    doc["extra"].pop("synthesis_version", None)  # what a manifest before version 2 holds
    (m.root / MANIFEST_NAME).write_text(json.dumps(doc))
    assert generators.synthesis_version(Manifest.load(m.root)) == 1


def _make_version_1(root) -> None:
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["extra"].pop("synthesis_version", None)
    (root / MANIFEST_NAME).write_text(json.dumps(doc))


def test_old_version_is_read_but_never_mixed(tmp_path, capsys):
    args = ["generate", "--storage", tmp_path, "--samples", "40", "--samples-per-file", "16"]
    assert cli(*args) == 0
    root = tmp_path / "cifar10-hdf5"
    _make_version_1(root)
    assert verify_dataset(root) == []  # an old dataset still verifies (and loads)
    capsys.readouterr()
    assert cli(*args) == 2  # same options, other synthesis: refused, not "already complete"
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "synthesis version 1" in err and "version 3" in err and "--force" in err
    assert cli(*args, "--force") == 0
    assert generators.synthesis_version(Manifest.load(root)) == 3


def _set_version(root, version: int) -> None:
    doc = json.loads((root / MANIFEST_NAME).read_text())
    doc["extra"]["synthesis_version"] = version
    (root / MANIFEST_NAME).write_text(json.dumps(doc))


def test_a_version_counts_as_old_only_for_the_datasets_it_changed(tmp_path, capsys):
    """Versions are per dataset: version 3 changed cifar10's pixels (and unet3d), so a
    version-2 cifar10 dataset is refused as different samples, while imagenet's version is
    still 2 and such a dataset is complete."""
    cifar = ["generate", "--storage", tmp_path, "--samples", "40"]
    imagenet = ["generate", "--dataset", "imagenet", "--format", "files", "--samples", "4",
                "--storage", tmp_path]
    assert cli(*cifar) == 0 and cli(*imagenet) == 0
    _set_version(tmp_path / "cifar10-hdf5", 2)
    _set_version(tmp_path / "imagenet-files", 2)
    capsys.readouterr()
    assert cli(*cifar) == 2
    assert "synthesis version 2" in capsys.readouterr().err
    assert cli(*imagenet) == 0
    assert "already complete" in capsys.readouterr().err


def test_old_partial_run_is_not_resumed(tmp_path, capsys):
    root = tmp_path / "cifar10-hdf5"
    (root / ".iobench-partial").mkdir(parents=True)
    ident = GenerateConfig(storage=tmp_path, samples=40, samples_per_file=16).identity()
    ident.pop("synthesis_version", None)  # a journal left by version 1
    (root / ".iobench-partial" / "config.json").write_text(json.dumps(ident))
    (root / "part-00000.h5").write_bytes(b"old bytes")
    assert cli("generate", "--storage", tmp_path, "--samples", "40",
               "--samples-per-file", "16") == 2
    assert "synthesis version 1" in capsys.readouterr().err


def test_lmdb_transactions_split_without_changing_records(tmp_path, monkeypatch):
    from iobench.generators import lmdb as lmdb_writer

    cfg = dict(dataset="cifar10", format="lmdb", samples=50, samples_per_file=50)
    one = generate_dataset(GenerateConfig(storage=tmp_path / "one", **cfg))
    monkeypatch.setattr(lmdb_writer, "TXN_BYTES", 10 * 3200)  # 10 records per transaction
    many = generate_dataset(GenerateConfig(storage=tmp_path / "many", **cfg))
    import lmdb

    def records(m: Manifest) -> list[tuple[bytes, bytes]]:
        env = lmdb.open(str(m.path_of(m.data_files[0])), subdir=False, readonly=True,
                        lock=False)
        with env.begin() as txn:
            out = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        env.close()
        return out

    assert records(one) == records(many) and len(records(many)) == 50
    assert verify_dataset(many.root) == []

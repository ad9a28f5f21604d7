"""attograd.nn.onnx against the ONNX standard's own node tests and onnxruntime.

By default: a subset of the onnx package's backend node cases covering every op the runner implements, plus the bad
input checks. ATTOGRAD_ONNX_FULL=1: all 1,884 node cases through attograd and onnxruntime (pass counts printed, the
failures listed in onnx_node_failures.txt), and the PP-OCR models of rapidocr-onnxruntime against onnxruntime."""
from __future__ import annotations
import collections, glob, importlib, os, time
import pytest
np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper, TensorProto
from attograd import Tensor, dtypes
from attograd.nn.onnx import OnnxRunner, OPS, to_numpy
from helpers import DEVICES

FULL = os.environ.get("ATTOGRAD_ONNX_FULL", "") not in ("", "0")

# (module of onnx.backend.test.case.node, cases run by default): at least one case for every op in OPS, each small
DEFAULT: dict[str, list[str]] = {
  "abs": ["test_abs"], "acos": ["test_acos"], "acosh": ["test_acosh"], "add": ["test_add_bcast", "test_add_uint8"],
  "and_": ["test_and_bcast4v3d"], "argmax": ["test_argmax_negative_axis_keepdims_example_select_last_index"],
  "argmin": ["test_argmin_no_keepdims_example"], "asin": ["test_asin"], "asinh": ["test_asinh"], "atan": ["test_atan"],
  "atanh": ["test_atanh"], "averagepool": ["test_averagepool_2d_pads", "test_averagepool_2d_ceil"],
  "batch_normalization": ["test_batchnorm_epsilon", "test_batchnorm_epsilon_training_mode"], "bitshift": ["test_bitshift_left_uint16"],
  "bitwiseand": ["test_bitwise_and_i32_2d"], "bitwisenot": ["test_bitwise_not_3d"], "bitwiseor": ["test_bitwise_or_i16_4d"],
  "bitwisexor": ["test_bitwise_xor_ui8_bcast_4v3d"], "cast": ["test_cast_FLOAT_to_FLOAT16", "test_cast_FLOAT_to_BFLOAT16"],
  "castlike": ["test_castlike_FLOAT_to_DOUBLE"], "ceil": ["test_ceil"], "celu": ["test_celu"], "clip": ["test_clip_default_int8_min"],
  "concat": ["test_concat_3d_axis_negative_2"], "constant": ["test_constant"], "constantofshape": ["test_constantofshape_int_zeros"],
  "conv": ["test_conv_with_strides_and_asymmetric_padding", "test_conv_with_autopad_same"],
  "convtranspose": ["test_convtranspose_pads", "test_convtranspose_1d"], "cos": ["test_cos"], "cosh": ["test_cosh"],
  "cumsum": ["test_cumsum_2d_negative_axis", "test_cumsum_1d_reverse_exclusive"], "depthtospace": ["test_depthtospace_crd_mode_example"],
  "div": ["test_div_bcast", "test_div_int8"], "dropout": ["test_dropout_default_mask"], "einsum": ["test_einsum_batch_matmul"],
  "elu": ["test_elu"], "equal": ["test_equal_bcast"], "erf": ["test_erf"], "exp": ["test_exp"], "expand": ["test_expand_dim_changed"],
  "eyelike": ["test_eyelike_with_dtype"], "flatten": ["test_flatten_negative_axis2"], "floor": ["test_floor"],
  "gather": ["test_gather_negative_indices"], "gatherelements": ["test_gather_elements_negative_indices"],
  "gathernd": ["test_gathernd_example_int32_batch_dim1"], "gelu": ["test_gelu_tanh_1"], "gemm": ["test_gemm_all_attributes"],
  "globalaveragepool": ["test_globalaveragepool"], "globalmaxpool": ["test_globalmaxpool"], "greater": ["test_greater_bcast"],
  "greater_or_equal": ["test_greater_equal"], "groupnormalization": ["test_group_normalization_example"], "hardmax": ["test_hardmax_axis_1"],
  "hardsigmoid": ["test_hardsigmoid"], "hardswish": ["test_hardswish"], "identity": ["test_identity"],
  "instance_normalization": ["test_instancenorm_example"], "isinf": ["test_isinf_negative"], "isnan": ["test_isnan"],
  "layernormalization": ["test_layer_normalization_3d_axis1_epsilon"], "leakyrelu": ["test_leakyrelu"], "less": ["test_less_bcast"],
  "less_or_equal": ["test_less_equal"], "log": ["test_log"], "logsoftmax": ["test_logsoftmax_axis_1"],
  "lpnormalization": ["test_l1normalization_axis_last"], "lppool": ["test_lppool_2d_pads"], "lrn": ["test_lrn"],
  "matmul": ["test_matmul_4d"], "max": ["test_max_int32"], "maxpool": ["test_maxpool_2d_ceil", "test_maxpool_2d_same_lower", "test_maxpool_2d_uint8",
                                         "test_maxpool_with_argmax_2d_precomputed_strides"],
  "mean": ["test_mean_two_inputs"], "meanvariancenormalization": ["test_mvn"], "min": ["test_min_float16"], "mish": ["test_mish"],
  "mod": ["test_mod_mixed_sign_int32", "test_mod_mixed_sign_float32"], "mul": ["test_mul_bcast"], "neg": ["test_neg"],
  "nonzero": ["test_nonzero_example"], "not_": ["test_not_3d"], "onehot": ["test_onehot_negative_indices"], "or_": ["test_or_bcast3v1d"],
  "pad": ["test_constant_pad_negative_axes", "test_reflect_pad", "test_wrap_pad"], "pow": ["test_pow_types_float32_int64"],
  "prelu": ["test_prelu_broadcast"], "rangeop": ["test_range_int32_type_negative_delta"], "reciprocal": ["test_reciprocal"],
  "reduce_log_sum": ["test_reduce_log_sum_asc_axes"], "reduce_log_sum_exp": ["test_reduce_log_sum_exp_do_not_keepdims_example"],
  "reducel1": ["test_reduce_l1_keep_dims_example"], "reducel2": ["test_reduce_l2_negative_axes_keep_dims_example"],
  "reducemax": ["test_reduce_max_empty_set"], "reducemean": ["test_reduce_mean_negative_axes_keepdims_example"],
  "reducemin": ["test_reduce_min_bool_inputs"], "reduceprod": ["test_reduce_prod_do_not_keepdims_example"],
  "reducesum": ["test_reduce_sum_empty_axes_input_noop"], "reducesumsquare": ["test_reduce_sum_square_default_axes_keepdims_example"],
  "relu": ["test_relu"], "reshape": ["test_reshape_negative_extended_dims", "test_reshape_allowzero_reordered"],
  "resize": ["test_resize_upsample_scales_nearest", "test_resize_downsample_sizes_linear_pytorch_half_pixel",
             "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside", "test_resize_tf_crop_and_resize"],
  "round": ["test_round"], "scatterelements": ["test_scatter_elements_with_reduction_max"],
  "scatter": ["test_scatter_with_axis"], "selu": ["test_selu"],
  "shape": ["test_shape_start_negative_1"], "shrink": ["test_shrink_soft"], "sigmoid": ["test_sigmoid"], "sign": ["test_sign"],
  "sin": ["test_sin"], "sinh": ["test_sinh"], "size": ["test_size"], "slice": ["test_slice_neg_steps", "test_slice_start_out_of_bounds"],
  "softmax": ["test_softmax_axis_0"], "softplus": ["test_softplus"], "softsign": ["test_softsign"],
  "spacetodepth": ["test_spacetodepth_example"], "split": ["test_split_variable_parts_2d_opset18", "test_split_1d_uneven_split_opset18"],
  "sqrt": ["test_sqrt"], "squeeze": ["test_squeeze_negative_axes"], "sub": ["test_sub_uint8"], "sum": ["test_sum_two_inputs"],
  "swish": ["test_swish"], "tan": ["test_tan"], "tanh": ["test_tanh"], "thresholdedrelu": ["test_thresholdedrelu"],
  "tile": ["test_tile_precomputed"], "topk": ["test_top_k_smallest"], "transpose": ["test_transpose_all_permutations_3"],
  "trilu": ["test_tril_neg", "test_triu_one_row"], "unsqueeze": ["test_unsqueeze_unsorted_axes"], "upsample": ["test_upsample_nearest"],
  "where": ["test_where_long_example"], "xor": ["test_xor_bcast4v4d"],
  "negativeloglikelihoodloss": ["test_nllloss_NCd1d2_with_weight_reduction_mean"],
  "softmax_cross_entropy_loss": ["test_sce_mean_weight_ii_4d_log_prob"], "rmsnormalization": ["test_rms_normalization_4d_axis1"],
  "cumprod": ["test_cumprod_1d_reverse_exclusive"], "hannwindow": ["test_hannwindow"], "hammingwindow": ["test_hammingwindow_symmetric"],
  "blackmanwindow": ["test_blackmanwindow"], "bitcast": ["test_bitcast_2d_float32_to_int32"],
  "center_crop_pad": ["test_center_crop_pad_crop_and_pad"], "scatternd": ["test_scatternd_multiply"], "compress": ["test_compress_1"],
  "reversesequence": ["test_reversesequence_batch"], "quantizelinear": ["test_quantizelinear_axis"],
  "dequantizelinear": ["test_dequantizelinear_axis"], "dynamicquantizelinear": ["test_dynamicquantizelinear_min_adjusted"],
  "matmulinteger": ["test_matmulinteger"], "convinteger": ["test_convinteger_with_padding"],
  "qlinearmatmul": ["test_qlinearmatmul_3D_int8_float32"], "qlinearconv": ["test_qlinearconv"],
  "attention": ["test_attention_4d_gqa", "test_attention_3d_causal"], "if_": ["test_if_seq"],
  "loop": ["test_loop13_seq", "test_loop16_seq_none"], "scan": ["test_scan9_sum"],
  "sequence_map": ["test_sequence_map_add_2_sequences", "test_sequence_map_add_2_sequences_expanded"],
  "sequenceinsert": ["test_sequence_insert_at_front"], "splittosequence": ["test_split_to_sequence_nokeepdims"],
  "optionalgetelement": ["test_optional_get_element_optional_sequence"],
  "optionalhaselement": ["test_optional_has_element_empty_no_input_name_tensor_input"],
  "rotaryembedding": ["test_rotary_embedding_with_interleaved_rotary_dim"], "swiglu": ["test_swiglu_alpha"],
  "tensorscatter": ["test_tensorscatter_circular"], "unique": ["test_unique_not_sorted_without_axis", "test_unique_sorted_with_axis_3d"],
  "det": ["test_det_nd"], "rnn": ["test_rnn_seq_length"], "gru": ["test_gru_bidirectional"], "lstm": ["test_lstm_with_peepholes", "test_lstm_batchwise"],
}

# the narrow types (float8, float4, 4- and 2-bit ints, carried decoded), and ops run as the function body their ONNX
# schema defines (plain: AffineGrid; built for the node's input types: CausalConvWithState)
for _k, _v in {"cast": ["test_cast_FLOAT8E4M3FN_to_FLOAT16", "test_cast_FLOAT_to_INT4", "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2"],
               "castlike": ["test_castlike_FLOAT16_to_FLOAT4E2M1"], "quantizelinear": ["test_quantizelinear_e4m3fn", "test_quantizelinear_int4"],
               "dequantizelinear": ["test_dequantizelinear_uint4"], "affinegrid": ["test_affine_grid_2d"],
               "causal_conv_with_state": ["test_causal_conv_with_state_with_bias"], "dft": ["test_dft_axis", "test_dft_irfft_opset19"],
               "gridsample": ["test_gridsample_bicubic", "test_gridsample_reflection_padding", "test_gridsample_volumetric_nearest_align_corners_1"],
               "maxunpool": ["test_maxunpool_export_with_output_shape"], "col2im": ["test_col2im_strides", "test_col2im_dilations"],
               "nonmaxsuppression": ["test_nonmaxsuppression_center_point_box_format", "test_nonmaxsuppression_two_batches"],
               "unique": ["test_unique_bfloat16_sorted_without_axis"], "adam": ["test_adam_multiple"], "adagrad": ["test_adagrad"], "momentum": ["test_nesterov_momentum"]}.items():
  DEFAULT.setdefault(_k, []).extend(_v)

# the standard has no node case for these: tested below against numpy
NO_NODE_CASE = {"GlobalLpPool", "ConcatFromSequence", "SequenceErase", "Optional"}

# the standard's modules whose cases take seconds to generate (pure-Python reference pools): only the exports named like
# a default case run there (export_x makes test_x...), plus these, named unlike their cases
_SLOW_MODULES = {"averagepool", "maxpool", "lppool", "attention"}
_EXPORTS_OF_DEFAULT = {"export_attention_gqa"}

def _cases(modules, wanted: set[str] | None = None) -> dict:
  """The node cases of these modules of onnx.backend.test.case.node: importing a module runs every export_* of its
  classes, each computing its expected outputs. With `wanted`, the slow modules run only the exports that make them."""
  import onnx.backend.test.case.node as node_cases
  from onnx.backend.test.case import base
  orig = base._Exporter.__init__
  def only_wanted(cls, name, bases, dct):
    orig(cls, name, bases, {k: v for k, v in dct.items() if not k.startswith("export") or k in _EXPORTS_OF_DEFAULT or
                            (k != "export" and any(w.startswith(f"test_{k[len('export_'):]}") for w in wanted))})
  for m in modules:
    base._Exporter.__init__ = only_wanted if wanted is not None and m in _SLOW_MODULES else orig
    try: importlib.import_module(f"onnx.backend.test.case.node.{m}")
    finally: base._Exporter.__init__ = orig
  return {c.name: c for c in node_cases._NodeTestCases}

def _value(v):
  if isinstance(v, list): return [_value(x) for x in v]
  return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v

def _numpy(t): return to_numpy(t)

def _check(case, outputs: dict) -> None:
  for o, want in zip(case.model.graph.output, case.data_sets[0][1]):
    _check_value(case, o.name, _value(want), outputs[o.name])

def _check_value(case, name: str, want, got) -> None:
  if want is None or isinstance(want, list):  # an empty optional, a sequence
    assert (got is None) == (want is None), f"{name}: {got!r}, expected {want!r}"
    if want is not None:
      assert isinstance(got, list) and len(got) == len(want), f"{name}: a sequence of {len(got)}, expected {len(want)}"
      for i, (w, g) in enumerate(zip(want, got)): _check_value(case, f"{name}[{i}]", w, g)
    return
  want, got = np.asarray(want), np.asarray(got)
  assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
  assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
  if want.dtype.kind in "biuO": np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol, atol=case.atol, equal_nan=True)

def run_attograd(case) -> None:
  names = [i.name for i in case.model.graph.input]
  got = OnnxRunner(case.model)({n: _value(v) for n, v in zip(names, case.data_sets[0][0])})
  _check(case, {k: _numpy(v) for k, v in got.items()})

def run_onnxruntime(case) -> None:
  import onnxruntime as ort
  sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
  names = [i.name for i in case.model.graph.input]
  outs = sess.run(None, {n: _value(v) for n, v in zip(names, case.data_sets[0][0])})
  _check(case, {o.name: v for o, v in zip(case.model.graph.output, outs)})

@pytest.fixture(scope="module")
def default_cases() -> dict:
  # (the full run generates every case of these modules itself: a module imported with filtered exports stays so)
  return _cases(DEFAULT, None if FULL else {n for ns in DEFAULT.values() for n in ns})

def test_default_subset_covers_every_op(default_cases):
  missing = [n for ns in DEFAULT.values() for n in ns if n not in default_cases]
  assert not missing, f"cases not in this onnx version: {missing}"
  def op_types(g) -> set[str]:  # every node's op, subgraphs (If/Loop/Scan bodies) included
    return {n.op_type for n in g.node} | {t for n in g.node for a in n.attribute for sg in ([a.g] if a.type == a.GRAPH else a.graphs)
                                          for t in op_types(sg)}
  ops = {t for c in default_cases.values() if c.name in {n for ns in DEFAULT.values() for n in ns} for t in op_types(c.model.graph)}
  assert not set(OPS) - ops - NO_NODE_CASE, f"ops without a default case: {sorted(set(OPS) - ops - NO_NODE_CASE)}"

@pytest.mark.parametrize("name", [n for ns in DEFAULT.values() for n in ns])
def test_node(default_cases, name: str):
  run_attograd(default_cases[name])

@pytest.mark.skipif(not FULL, reason="ATTOGRAD_ONNX_FULL=1 runs all of the standard's node cases")
def test_all_node_cases():
  pytest.importorskip("onnxruntime")
  from onnx.backend.test.case.node import collect_testcases
  cases = collect_testcases(None)
  results: dict[str, dict[str, str]] = {"attograd": {}, "onnxruntime": {}}
  t0 = time.perf_counter()
  for c in cases:
    for who, fn in (("attograd", run_attograd), ("onnxruntime", run_onnxruntime)):
      try: fn(c); results[who][c.name] = ""
      except Exception as e: results[who][c.name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
  n = len(cases)
  passed = {who: sum(not v for v in r.values()) for who, r in results.items()}
  with open(os.path.join(os.path.dirname(__file__), "onnx_node_failures.txt"), "w") as f:
    f.write(f"# ONNX {onnx.__version__} backend node cases: attograd {passed['attograd']}/{n}, onnxruntime {passed['onnxruntime']}/{n}\n")
    for name, why in sorted(results["attograd"].items()):
      if why: f.write(f"{name}\t{why}\n")
  print(f"\nONNX node cases: attograd {passed['attograd']}/{n} ({100 * passed['attograd'] / n:.1f}%), "
        f"onnxruntime {passed['onnxruntime']}/{n} ({100 * passed['onnxruntime'] / n:.1f}%) in {time.perf_counter() - t0:.0f} s")
  by_op = collections.Counter(c.model.graph.node[0].op_type for c in cases if results["attograd"][c.name])
  print("attograd failures by op:", dict(by_op.most_common()))

@pytest.mark.parametrize("ty", [17, 18, 19, 20, 23, 21, 22, 25, 26])
@pytest.mark.parametrize("saturate", [0, 1])
def test_narrow_types_round_like_ml_dtypes(ty: int, saturate: int):
  """Cast onto the grid of each narrow type (float8, float4, 4- and 2-bit ints) against ml_dtypes' own conversion."""
  ml_dtypes = pytest.importorskip("ml_dtypes")
  from attograd.nn.onnx import NARROW
  f = NARROW[ty]
  npt = getattr(ml_dtypes, f.np_name)
  rng = np.random.default_rng(ty)
  if f.is_float:
    g = np.arange(256, dtype=np.uint8).view(npt).astype(np.float32) if f.mbits > 1 else np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
    g = np.unique(np.abs(g[np.isfinite(g)]))
    # every grid value, the midpoints between neighbours (ties go to even), just off them, and the specials
    mids = (g[1:] + g[:-1]) / 2
    x = np.concatenate([g, -g, mids, -mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), rng.standard_normal(300) * f.max / 4,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, f.max * 1.03, -f.max * 1.1, 1e30, 1e-30]]).astype(np.float32)
    want = (np.clip(x, -f.max, f.max) if saturate else x).astype(npt)
  else:
    x = np.concatenate([np.arange(-20, 20), rng.uniform(-30, 30, 100)]).astype(np.float32)
    want = x.astype(npt)
  m = _model([helper.make_node("Cast", ["x"], ["y"], to=ty, saturate=saturate)], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])],
             [helper.make_tensor_value_info("y", ty, [len(x)])], opset=23)
  got = to_numpy(OnnxRunner(m)({"x": x})["y"])
  assert got.dtype == want.dtype
  np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
  # and back: the carrier gives the values out exactly
  back = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], [helper.make_tensor_value_info("x", ty, [len(x)])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(x)])], opset=23)
  np.testing.assert_array_equal(OnnxRunner(back)({"x": want})["y"].numpy(), want.astype(np.float32))

@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8e8m0_rounds_like_onnx(round_mode: str, saturate: int):
  from onnx.numpy_helper import to_float8e8m0
  rng = np.random.default_rng(1)
  x = np.concatenate([2.0 ** np.arange(-127, 128), 1.5 * 2.0 ** np.arange(-126, 127), rng.standard_normal(200) * 1e3,
                      [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -2.5, 1e-45, 1e-39]]).astype(np.float32)
  m = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, saturate=saturate, round_mode=round_mode)],
             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])], [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [len(x)])],
             opset=24)
  got, want = to_numpy(OnnxRunner(m)({"x": x})["y"]), to_float8e8m0(x, bool(saturate), round_mode)
  np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))

def test_narrow_types_refused_by_other_ops():
  ml_dtypes = pytest.importorskip("ml_dtypes")
  m = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2])],
             [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2])], opset=23)
  with pytest.raises(NotImplementedError, match="node 'r'.*Relu of float8e4m3fn"):
    OnnxRunner(m)({"x": np.ones(2, ml_dtypes.float8_e4m3fn)})

def test_global_lp_pool():
  x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
  m = _model([helper.make_node("GlobalLpPool", ["x"], ["y"], p=3)], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1, 1])])
  want = (np.abs(x) ** 3).sum((2, 3), keepdims=True) ** (1 / 3)
  np.testing.assert_allclose(OnnxRunner(m)({"x": x})["y"].numpy(), want, rtol=1e-5)

def test_sequence_ops():
  f = TensorProto.FLOAT
  nodes = [helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]), helper.make_node("SequenceErase", ["s", "one"], ["s2"]),
           helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0), helper.make_node("ConcatFromSequence", ["s2"], ["stk"], axis=-1, new_axis=1),
           helper.make_node("Optional", ["a"], ["opt"]), helper.make_node("OptionalHasElement", ["opt"], ["has"])]
  one = numpy_helper.from_array(np.array(1, np.int64), "one")
  vi = lambda n, t, shp: helper.make_tensor_value_info(n, t, shp)
  m = _model(nodes, [vi("a", f, [2, 3]), vi("b", f, [2, 3])], [vi("cat", f, [4, 3]), vi("stk", f, [2, 3, 2]), vi("has", TensorProto.BOOL, [])], [one])
  a, b = np.arange(6, dtype=np.float32).reshape(2, 3), -np.ones((2, 3), np.float32)
  out = OnnxRunner(m)({"a": a, "b": b})
  np.testing.assert_array_equal(out["cat"].numpy(), np.concatenate([a, a]))
  np.testing.assert_array_equal(out["stk"].numpy(), np.stack([a, a], -1))
  assert out["has"].item() is True

# ***** real models: PP-OCR from rapidocr-onnxruntime *****

def _ppocr(name: str) -> str:
  rapid = pytest.importorskip("rapidocr_onnxruntime")
  found = glob.glob(os.path.join(os.path.dirname(rapid.__file__), "models", name))
  if not found: pytest.skip(f"{name} is not in rapidocr_onnxruntime")
  return found[0]

@pytest.mark.skipif(not FULL, reason="ATTOGRAD_ONNX_FULL=1: compiling a whole model takes a minute on a cold kernel cache")
@pytest.mark.parametrize("name, shape", [("ch_PP-OCRv4_det_infer.onnx", (1, 3, 96, 128)), ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 160)),
                                         ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192))])
def test_ppocr_matches_onnxruntime(name: str, shape):
  ort = pytest.importorskip("onnxruntime")
  path = _ppocr(name)
  x = np.random.default_rng(0).random(shape, dtype=np.float32)
  want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  runner = OnnxRunner(path)
  got = list(runner({"x": x}).values())[0].numpy()
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
  again = list(runner({"x": x * 0.5}).values())[0].numpy()  # a second run reuses the shape-folded constants
  want2 = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x * 0.5})[0]
  np.testing.assert_allclose(again, want2, rtol=1e-3, atol=1e-4)

@pytest.mark.skipif(not FULL, reason="ATTOGRAD_ONNX_FULL=1: compiling three models takes minutes on a cold kernel cache")
def test_ocr_example_reads_rendered_line():
  pytest.importorskip("PIL")
  _ppocr("ch_PP-OCRv4_rec_infer.onnx")
  import runpy
  ocr = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "examples", "ocr.py"), run_name="ocr")
  lines = ocr["Ocr"](ocr["models_dir"]())(ocr["render"]())
  assert [t for _, t, _ in lines] == [ocr["TEXT"]]

# ***** bad input: a clear error naming the node or input *****

def _model(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
  g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
  return helper.make_model(g, opset_imports=[helper.make_operatorsetid("", opset)]).SerializeToString()

def _relu_model() -> bytes:
  return _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])])

def test_runs_bytes_path_and_proto(tmp_path):
  raw = _relu_model()
  p = tmp_path / "m.onnx"
  p.write_bytes(raw)
  x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
  for m in (raw, str(p), onnx.load_from_string(raw)):
    np.testing.assert_array_equal(OnnxRunner(m)({"x": x})["y"].numpy(), np.maximum(x, 0))
  np.testing.assert_array_equal(OnnxRunner(raw)(x=Tensor(x))["y"].numpy(), np.maximum(x, 0))

def test_jit_replays_with_new_inputs():
  w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Shape", ["c"], ["s"]),
           helper.make_node("Reshape", ["c", "flat"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
  inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, -1], np.int64), "flat")]
  m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100])], inits)
  import torch
  runner = OnnxRunner(m, jit=True)
  for i in range(4):  # compile and fold, capture, then replays
    x = np.random.default_rng(i).standard_normal((1, 3, 5, 5)).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).reshape(1, -1).relu().numpy()
    np.testing.assert_allclose(runner({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("hw,kernel,strides,pads,cin", [((13, 17), (3, 3), (2, 2), [1, 1, 1, 1], 3), ((15, 20), (5, 3), (2, 3), [2, 0, 1, 2], 2),
                                                      ((9, 9), (1, 1), (2, 2), [0, 0, 0, 0], 4), ((10, 11), (2, 4), (3, 2), [0, 1, 0, 0], 1)])
def test_strided_conv_space_to_depth(hw, kernel, strides, pads, cin):
  """A strided conv of few channels runs as a stride-1 conv of its input cut in blocks: odd sizes, uneven pads, a kernel
  smaller than the stride (the input cropped), against torch."""
  import torch
  rng = np.random.default_rng(0)
  x, w = rng.random((2, cin, *hw), dtype=np.float32), rng.random((5, cin, *kernel), dtype=np.float32) - 0.5
  b = rng.random(5, dtype=np.float32)
  m = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(kernel), strides=list(strides), pads=pads)],
             [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
             [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
  xt = torch.nn.functional.pad(torch.tensor(x), (pads[1], pads[3], pads[0], pads[2]))
  want = torch.nn.functional.conv2d(xt, torch.tensor(w), torch.tensor(b), stride=strides).numpy()
  np.testing.assert_allclose(OnnxRunner(m)({"x": x})["y"].numpy(), want, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("as_constant", [False, True])
def test_matmul_weight_read_from_panels(as_constant: bool):
  """A MatMul's big constant right operand (PP-OCR rec's 120 x 6625 head) is packed once in column panels (the last
  padded): a run's kernels read the panels, never the matrix (each panel's rows a matrix row apart); a small one (and a
  vector times it) stays as it is. Against numpy, replayed by the JIT."""
  from attograd.nn import onnx as ox
  rng = np.random.default_rng(0)
  big, small = rng.standard_normal((120, 6625)).astype(np.float32), rng.standard_normal((6625, 8)).astype(np.float32)
  nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "v"], ["y"]), helper.make_node("MatMul", ["z", "w"], ["u"])]
  params = {"w": big, "v": small}
  if as_constant: nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(a, k)) for k, a in params.items()] + nodes
  f = TensorProto.FLOAT
  m = _model(nodes, [helper.make_tensor_value_info("x", f, [1, 40, 120]), helper.make_tensor_value_info("z", f, [120])],
             [helper.make_tensor_value_info(n, f, None) for n in ("h", "y", "u")], [] if as_constant else [numpy_helper.from_array(a, k) for k, a in params.items()])
  runner = OnnxRunner(m, jit=True)
  assert runner.graph.weight("w@panels").shape == (415, 120, ox.PANEL_WIDTH) and runner.graph.weight("v@panels") is runner.graph.weight("v")
  for i in range(4):
    x, z = rng.standard_normal((1, 40, 120)).astype(np.float32), rng.standard_normal(120).astype(np.float32)
    out = runner({"x": x, "z": z})
    np.testing.assert_allclose(out["h"].numpy(), x @ big, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["y"].numpy(), (x @ big) @ small, rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(out["u"].numpy(), z @ big, rtol=1e-4, atol=1e-4)
  (jit,) = runner._jits.values()
  from attograd.engine.realize import buffer_of
  w = buffer_of(runner.graph.weight("w").uop.base)
  assert not any(b is w for ei in jit.replay.plan.items for b in ei.bufs), "a replay reads the panels, not the matrix"

def test_jit_without_folding_replays_and_reuses_input_memory():
  """A model with nothing to fold (no Shape op) is replayed from its third call like any other; each replay's numpy input
  is copied into the same memory, and a scalar initializer is a constant in the kernel (no buffer of its own)."""
  nodes = [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
  m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
             [numpy_helper.from_array(np.array(-2.0, np.float32), "k")])
  runner = OnnxRunner(m, jit=True)
  for i in range(5):
    x = np.random.default_rng(i).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(runner({"x": x})["y"].numpy(), np.maximum(x * -2, 0))
  (jit,) = runner._jits.values()
  assert jit.cnt == 2 and len(runner._staging) == 1
  assert len(jit.replay.plan.items) == 1 and len(jit.replay.plan.items[0].bufs) == 2  # output and x: k is a constant
  np.testing.assert_array_equal(runner({"x": x[:, ::-1]})["y"].numpy(), np.maximum(x[:, ::-1] * -2, 0))  # a view: copied whole

@pytest.mark.parametrize("as_constants", [False, True])
def test_conv_batchnorm_folded(as_constants: bool):
  """Conv -> BatchNormalization with fixed parameters (initializers, or Constant nodes as exporters often write them)
  runs as one conv with the normalization folded into its weight and bias; a conv whose output is read twice is not
  folded. Both against torch."""
  import torch
  rng = np.random.default_rng(0)
  w, b = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  sc, sh, mu, var = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32), \
    rng.standard_normal(4).astype(np.float32), rng.random(4).astype(np.float32) + 0.5
  params = {"w": w, "b": b, "sc": sc, "sh": sh, "mu": mu, "var": var}
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
           helper.make_node("BatchNormalization", ["c", "sc", "sh", "mu", "var"], ["y"], epsilon=1e-3),
           helper.make_node("Conv", ["x", "w"], ["c2"]), helper.make_node("BatchNormalization", ["c2", "sc", "sh", "mu", "var"], ["y2"]),
           helper.make_node("Relu", ["c2"], ["r2"])]
  if as_constants: nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in params.items()] + nodes
  inits = [] if as_constants else [numpy_helper.from_array(v, k) for k, v in params.items()]
  f = TensorProto.FLOAT
  m = _model(nodes, [helper.make_tensor_value_info("x", f, [1, 3, 6, 6])],
             [helper.make_tensor_value_info(n, f, None) for n in ("y", "y2", "r2")], inits)
  runner = OnnxRunner(m)
  assert [n.op for n in runner.nodes] == ["Conv", "Conv", "BatchNormalization", "Relu"]
  x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
  out = runner({"x": x})
  T = torch.tensor
  c, c2 = torch.nn.functional.conv2d(T(x), T(w), T(b), padding=1), torch.nn.functional.conv2d(T(x), T(w))
  bn = lambda t, eps: torch.nn.functional.batch_norm(t, T(mu), T(var), T(sc), T(sh), eps=eps)
  np.testing.assert_allclose(out["y"].numpy(), bn(c, 1e-3).numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out["y2"].numpy(), bn(c2, 1e-5).numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out["r2"].numpy(), c2.relu().numpy(), rtol=1e-4, atol=1e-5)

def test_external_data_initializer(tmp_path):
  w = np.arange(6, dtype=np.float32).reshape(2, 3)
  m = onnx.load_from_string(_model([helper.make_node("Add", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [numpy_helper.from_array(w, "w")]))
  onnx.save_model(m, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
  assert (tmp_path / "w.bin").exists()
  np.testing.assert_array_equal(OnnxRunner(str(tmp_path / "m.onnx"))({"x": np.ones((2, 3), np.float32)})["y"].numpy(), w + 1)

def test_bad_inputs():
  r = OnnxRunner(_relu_model())
  with pytest.raises(TypeError, match="'x'.*int32"): r({"x": np.zeros((2, 3), np.int32)})
  with pytest.raises(ValueError, match="'x'.*rank"): r({"x": np.zeros((2, 3, 1), np.float32)})
  with pytest.raises(ValueError, match="'x'"): r({"x": np.zeros((3, 3), np.float32)})
  with pytest.raises(KeyError, match="missing input 'x'"): r({})
  with pytest.raises(KeyError, match="'z' is not an input"): r({"x": np.zeros((2, 1), np.float32), "z": 1})

def test_bad_models():
  with pytest.raises(ValueError, match="not a valid ONNX model"): OnnxRunner(_relu_model()[:-7] + b"\xff\xff\xff")
  missing = _model([helper.make_node("Relu", ["nope"], ["y"], name="r")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
  with pytest.raises(ValueError, match="node 'r'.*'nope'"): OnnxRunner(missing)
  unsupported = _model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="d")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
  with pytest.raises(NotImplementedError, match="'TfIdfVectorizer'.*'d'.*opset 17"): OnnxRunner(unsupported)
  bad_attr = _model([helper.make_node("Relu", ["x"], ["y"], name="r", color="red")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
  with pytest.raises(NotImplementedError, match="attribute 'color' of node 'r'"): OnnxRunner(bad_attr)
  strings = _model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.STRING, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.STRING, [1])])
  with pytest.raises(NotImplementedError, match="string"): OnnxRunner(strings)({"x": np.array(["a"], dtype=object)})

def test_fuzzed_model_bytes():
  """Mutated bytes of a real model: loading either works or raises a clear error, never crashes or hangs."""
  raw = bytearray(open(_ppocr("ch_ppocr_mobile_v2.0_cls_infer.onnx"), "rb").read())
  rng = np.random.default_rng(1)
  for _ in range(30):
    b = bytearray(raw)
    for i in rng.integers(0, len(b), 8): b[i] = int(rng.integers(0, 256))
    cut = bytes(b[:int(rng.integers(len(b) // 2, len(b)))]) if rng.random() < 0.3 else bytes(b)
    try: OnnxRunner(cut)
    except (ValueError, NotImplementedError, TypeError, KeyError): pass

def test_command_line(tmp_path, capsys):
  # python -m attograd.nn.onnx: free dims from --dim (by name) or --shape (a whole input, for unnamed dims); a model that
  # refuses the inputs ends with one clear line, not a traceback
  from attograd.nn.onnx import _main
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
  shape = numpy_helper.from_array(np.array([2, 4], np.int64), "shape")
  g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g", [x], [y], [shape])
  path = str(tmp_path / "m.onnx")
  onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
  _main([path, "--shape", "x=2,4", "--runs", "1"])
  out = capsys.readouterr().out
  assert "-> (2, 4)" in out and "output y: float32 (2, 4)" in out
  _main([path, "--dim", "batch=8", "--runs", "1"])
  assert "-> (8, 1)" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="(?s)does not run on these inputs.*--shape"): _main([path, "--runs", "1"])
  with pytest.raises(SystemExit): _main([path, "--shape", "nope=1,2"])
  assert "names no input" in capsys.readouterr().err

@pytest.mark.parametrize("device", [d for d in ("LLVM", "CL", "WEBGPU") if d in DEVICES])
def test_runs_on_other_backends(device):
  # a model whose weights are Constant nodes (as PaddleOCR exports them) and a conv + batch norm fused at load: values
  # made by ops with no tensor inputs land on the runner's device, the whole run stays there
  rng = np.random.default_rng(0)
  w, scale, b, mean, var = rng.standard_normal((4, 3, 3, 3)), rng.random(4) + .5, rng.standard_normal(4), rng.standard_normal(4), rng.random(4) + .5
  const = lambda name, a: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(a, np.float32), name + "_v"))
  nodes = [const("w", w), *(const(n, a) for n, a in (("s", scale), ("b", b), ("m", mean), ("v", var))),
           helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
           helper.make_node("Relu", ["n"], ["r"]), helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
  m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])])
  x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
  y = OnnxRunner(m, device=device)({"x": x})["y"]
  assert y.device == device
  np.testing.assert_allclose(y.numpy(), OnnxRunner(m)({"x": x})["y"].numpy(), rtol=1e-4, atol=1e-5)

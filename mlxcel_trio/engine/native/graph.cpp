// The kernels of kernels.cpp as an MLX primitive: y = x . W^T (+ bias) is a
// node of MLX's lazy graph, evaluated on MLX's CPU stream like its own ops.
// Through ctypes alone (kernels.cpp) each product must evaluate its input
// first, so a decode step stops and waits ~4 times per layer and builds no
// graph ahead; as a node, the whole step is one graph and mlx-lm's
// async_eval overlaps building the next step with computing this one.
//
// Built against the installed mlx wheel's headers and libmlx.so (the same
// library Python's mlx loaded).  The arrays come from Python as the
// objects themselves (ctypes.py_object): a Python mx.array is a nanobind
// instance holding an mlx::core::array, found at the offset nanobind stores
// in the instance header.  `mlxg_check` validates that reading on arrays of
// known shapes before anything else is used; the Python side falls back to
// the ctypes path when it fails.

// kernels.cpp comes first, by the build's `-include` (build.py).

#include <memory>
#include <numeric>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace mc = mlx::core;

namespace {

// nanobind's instance header (nb_inst): PyObject_HEAD, int32 offset, then
// bit fields: state (2 bits, 2 = ready), direct, internal.
struct Inst {
  intptr_t refcnt;
  void* type;
  int32_t offset;
  uint32_t flags;
};

mc::array* unwrap(void* obj) {
  auto* i = static_cast<Inst*>(obj);
  if ((i->flags & 3u) != 2u) return nullptr;  // not a constructed instance
  char* p = static_cast<char*>(obj) + i->offset;
  bool direct = (i->flags >> 2) & 1u;
  return reinterpret_cast<mc::array*>(direct ? p : *reinterpret_cast<char**>(p));
}

// Gathers a strided float32 array into row-major order.
void gather(const float* src, const mc::Shape& shape, const mc::Strides& strides, float* dst) {
  const int nd = int(shape.size());
  std::vector<int> idx(nd, 0);
  const long total = long(std::accumulate(shape.begin(), shape.end(), 1L,
                                          [](long a, int b) { return a * b; }));
  for (long i = 0; i < total; ++i) {
    long off = 0;
    for (int d = 0; d < nd; ++d) off += long(idx[d]) * strides[d];
    dst[i] = src[off];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

class NativeGemm : public mc::Primitive {
 public:
  // bits 16: 16-bit weight (wdtype 1 bf16, 2 f16); 4 / 8: affine with
  // scales and biases of sdtype.  Inputs: x, w, [scales, biases], [bias].
  NativeGemm(mc::Stream s, int bits, int wdtype, int sdtype, int group, bool has_bias)
      : mc::Primitive(s), bits_(bits), wdtype_(wdtype), sdtype_(sdtype), group_(group),
        has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    mc::array& y = outs[0];
    y.set_data(mc::allocator::malloc(y.nbytes()));
    const mc::array& x = in[0];
    auto& enc = mc::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(y);
    const int K = x.shape(-1);
    const int M = int(x.size() / K);
    const int N = y.shape(-1);
    const float* xp = x.data<float>();
    float* xc = nullptr;
    if (!x.flags().row_contiguous) {
      mc::array tmp(x.shape(), mc::float32, nullptr, {});
      tmp.set_data(mc::allocator::malloc(tmp.nbytes()));
      xc = tmp.data<float>();
      enc.add_temporary(tmp);
      enc.dispatch([xp, xc, shape = x.shape(), strides = x.strides()] {
        gather(xp, shape, strides, xc);
      });
      xp = xc;
    }
    const float* bias = has_bias_ ? in.back().data<float>() : nullptr;
    float* yp = y.data<float>();
    if (bits_ == 16) {
      const uint16_t* w = in[1].data<uint16_t>();
      const bool bf16 = wdtype_ == 1;
      enc.dispatch([=] {
        if (bf16)
          gemm_16<true>(xp, M, K, w, N, bias, yp);
        else
          gemm_16<false>(xp, M, K, w, N, bias, yp);
      });
    } else {
      const uint8_t* w = in[1].data<uint8_t>();
      const void* s = in[2].data<void>();
      const void* b = in[3].data<void>();
      const int bits = bits_, group = group_, sdtype = sdtype_;
      enc.dispatch([=] {
        if (bits == 4)
          affine<4>(xp, M, K, w, s, b, sdtype, group, N, bias, yp);
        else
          affine<8>(xp, M, K, w, s, b, sdtype, group, N, bias, yp);
      });
    }
  }

  void eval_gpu(const std::vector<mc::array>&, std::vector<mc::array>&) override {
    throw std::runtime_error("the native kernels run on the CPU only");
  }

  const char* name() const override { return "MlxcelNativeGemm"; }

  bool is_equivalent(const mc::Primitive& other) const override {
    auto& o = static_cast<const NativeGemm&>(other);
    return bits_ == o.bits_ && wdtype_ == o.wdtype_ && sdtype_ == o.sdtype_ &&
           group_ == o.group_ && has_bias_ == o.has_bias_;
  }

 private:
  int bits_, wdtype_, sdtype_, group_;
  bool has_bias_;
};

// The kernels read weights in place: evaluated, row-contiguous.
bool stored(const mc::array& a) {
  return a.status() != mc::array::Status::unscheduled && a.flags().row_contiguous;
}

int code(mc::Dtype d) {
  if (d == mc::float32) return 0;
  if (d == mc::bfloat16) return 1;
  if (d == mc::float16) return 2;
  return -1;
}

}  // namespace

extern "C" {

int mlxg_abi() { return 1; }

// 0 when `obj` reads as an array of `shape` (ndim values) and float32.
int mlxg_check(void* obj, const int* shape, int ndim) {
  mc::array* a = unwrap(obj);
  if (a == nullptr || a->ndim() != size_t(ndim) || a->dtype() != mc::float32) return -1;
  for (int i = 0; i < ndim; ++i)
    if (a->shape(i) != shape[i]) return -1;
  return 0;
}

// *out = x . w^T (+ bias) as a graph node.  x: float32 [..., K]; w: bf16 /
// f16 [N, K] (bits 16), or MLX's affine uint32 [N, K * bits / 32] with
// scales / biases [N, K / group]; bias: float32 [N] or null.  Returns 0, or
// -1 for what it does not take (nothing is changed then).
int mlxg_gemm(void* out, void* xo, void* wo, void* so, void* bo, void* biaso, int bits,
              int group) {
  mc::array* y = unwrap(out);
  mc::array* x = unwrap(xo);
  mc::array* w = unwrap(wo);
  if (!y || !x || !w || x->ndim() < 1 || x->dtype() != mc::float32 || w->ndim() != 2) return -1;
  const int K = x->shape(-1);
  const int N = w->shape(0);
  if (K <= 0 || N <= 0 || x->size() == 0 || !stored(*w)) return -1;
  std::vector<mc::array> inputs{*x, *w};
  int wdtype = 0, sdtype = 0;
  if (bits == 16) {
    wdtype = code(w->dtype());
    if ((wdtype != 1 && wdtype != 2) || w->shape(1) != K) return -1;
  } else if (bits == 4 || bits == 8) {
    mc::array* s = unwrap(so);
    mc::array* b = unwrap(bo);
    if (!s || !b || w->dtype() != mc::uint32 || group % 32 != 0 || K % group != 0) return -1;
    if (w->shape(1) != K * bits / 32) return -1;
    sdtype = code(s->dtype());
    if (sdtype < 0 || b->dtype() != s->dtype() || s->ndim() != 2 || b->ndim() != 2 ||
        s->shape(0) != N || s->shape(1) != K / group || b->shape(0) != N ||
        b->shape(1) != K / group)
      return -1;
    if (!stored(*s) || !stored(*b)) return -1;
    inputs.push_back(*s);
    inputs.push_back(*b);
  } else {
    return -1;
  }
  bool has_bias = false;
  if (biaso != nullptr) {
    mc::array* bias = unwrap(biaso);
    if (!bias || bias->dtype() != mc::float32 || bias->ndim() != 1 || bias->shape(0) != N)
      return -1;
    inputs.push_back(*bias);
    has_bias = true;
  }
  mc::Shape shape = x->shape();
  shape.back() = N;
  try {
    mc::Stream s = mc::default_stream(mc::Device::cpu);
    *y = mc::array(std::move(shape), mc::float32,
                   std::make_shared<NativeGemm>(s, bits, wdtype, sdtype, group, has_bias),
                   std::move(inputs));
  } catch (...) {
    return -1;
  }
  return 0;
}

}  // extern "C"

// A tiny custom op for the tests: ExportkitTimesTwo(x: float) -> 2 * x, CPU kernel only.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"

using namespace tensorflow;

REGISTER_OP("ExportkitTimesTwo")
    .Input("x: float")
    .Output("y: float")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

class ExportkitTimesTwoOp : public OpKernel {
 public:
  explicit ExportkitTimesTwoOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    auto in = input.flat<float>();
    auto out = output->flat<float>();
    for (int64_t i = 0; i < in.size(); ++i) out(i) = 2.0f * in(i);
  }
};

REGISTER_KERNEL_BUILDER(Name("ExportkitTimesTwo").Device(DEVICE_CPU), ExportkitTimesTwoOp);

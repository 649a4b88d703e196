// The checks every family's attention dropout meets on one rank (gpt_test, llama_test): two
// models of one seed draw the same first mask, the mask changes the loss, each call draws a new
// one (the module named `module_name` counting it), and evaluation draws none and equals the
// model without dropout.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "nn/layers.h"
#include "tensor/tensor.h"

namespace loom::testing {

// `a` and `b`: the same config with attention dropout and the same seed; `reference`: the
// config without it, same seed. Each model is left in evaluation mode.
template <typename Model>
void expect_attention_dropout_draws(Model& a, Model& b, Model& reference,
                                    const std::string& module_name, const Tensor& x,
                                    const Tensor& y) {
  const double first = a.loss(x, y).template item<double>();
  EXPECT_EQ(first, b.loss(x, y).template item<double>()) << "same seed, same first mask";
  EXPECT_NE(first, reference.loss(x, y).template item<double>()) << "the mask reaches the kernel";
  EXPECT_NE(first, a.loss(x, y).template item<double>()) << "each call draws a new mask";
  const nn::Dropout* module = nullptr;
  for (const auto& [name, m] : a.named_modules()) {
    if (name == module_name) module = dynamic_cast<const nn::Dropout*>(m);
  }
  ASSERT_NE(module, nullptr) << module_name;
  EXPECT_EQ(module->calls(), 2u);
  a.eval();
  reference.eval();
  EXPECT_EQ(a.loss(x, y).template item<double>(), reference.loss(x, y).template item<double>());
  EXPECT_EQ(module->calls(), 2u) << "evaluation draws nothing";
}

}  // namespace loom::testing

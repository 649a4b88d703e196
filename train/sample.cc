#include "train/sample.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "data/utf8.h"
#include "tensor/ops.h"

namespace loom::train {

std::vector<int64_t> generate_sample(ParallelModel& model, const data::TokenCorpus& data,
                                     int64_t vocab_size, Device device,
                                     const SampleOptions& options) {
  NoGradGuard no_grad;
  const EvalMode eval(model);  // as Trainer::evaluate: no dropout, no router load counted
  std::vector<int64_t> context(1);
  data.read(0, 1, context.data());
  for (int64_t i = 0; i < options.tokens; ++i) {
    const int64_t start =
        std::max<int64_t>(0, static_cast<int64_t>(context.size()) - options.window);
    std::vector<int64_t> window(context.begin() + start, context.end());
    const int64_t length = static_cast<int64_t>(window.size());
    // Sequence parallelism needs a length that divides by tp: pad on the right, which causal
    // attention keeps from affecting the positions before it.
    window.resize((length + options.multiple - 1) / options.multiple * options.multiple, 0);
    const Tensor logits = model.logits(
        ops::from_vector_i64(window, {1, static_cast<int64_t>(window.size())}, device));
    const Tensor last = ops::narrow(ops::reshape(logits, {-1, vocab_size}), 0, length - 1, 1);
    const auto probs = ops::to_vector(ops::softmax(last, 1));
    // Sample with a counter-based draw (the same on every rank).
    const double u = ops::to_vector(ops::uniform({1}, options.seed + 7919 * i, 0.0, 1.0))[0];
    double acc = 0;
    int64_t choice = static_cast<int64_t>(probs.size()) - 1;
    for (size_t t = 0; t < probs.size(); ++t) {
      acc += probs[t];
      if (u < acc) {
        choice = static_cast<int64_t>(t);
        break;
      }
    }
    context.push_back(choice);
  }
  return context;
}

std::string sample_text(const std::vector<int64_t>& tokens, const data::TokenCorpus& data,
                        const data::Tokenizer* tokenizer) {
  if (tokenizer) {
    std::vector<int32_t> ids;
    for (int64_t t : tokens) {
      if (t < tokenizer->vocab_size()) ids.push_back(static_cast<int32_t>(t));  // padding ids
    }
    return data::utf8_lossy(tokenizer->decode(ids));
  }
  if (data.vocab_size() != 256) return "";
  std::string text;
  for (int64_t t : tokens) text += t < 256 ? static_cast<char>(t) : '?';  // padding ids
  return data::utf8_lossy(text);
}

}  // namespace loom::train

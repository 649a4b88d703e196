// An output head tied to the token embedding: logits = x @ embedding.weight^T (GPT-2's lm_head,
// Llama 3.2's with tie_word_embeddings). It owns no parameter (a state dict lists the embedding's
// weight once) but is a module, so a parallel plan can lay out its input: with the embedding
// sharded by vocabulary (RowwiseParallel on it) and a Replicate input, the logits come out
// vocabulary-sharded, ready for loss-parallel cross entropy.
#pragma once

#include <memory>

#include "nn/layers.h"
#include "nn/module.h"

namespace loom::models {

class TiedHead : public nn::Module {
 public:
  explicit TiedHead(std::shared_ptr<nn::Embedding> embedding)
      : Module("TiedHead"), embedding_(std::move(embedding)) {}
  Tensor forward(const Tensor& x) override;
  const nn::Embedding& embedding() const { return *embedding_; }

 private:
  std::shared_ptr<nn::Embedding> embedding_;
};

}  // namespace loom::models

// What a Hugging Face checkpoint says about generation that Loom's model config does not hold:
// the token ids of its config.json (bos, eos, pad) and its generation_config.json. A job started
// from one (--init-from) keeps them, records them in its distributed checkpoints (extra "hf"), and
// writes them beside every Hugging Face file it makes (--save, a resumed job's --save,
// //tools/checkpoint:consolidate), so generate() after the round trip stops where the original
// did.
//
//   {"token_ids": {"bos_token_id": 128000, "eos_token_id": [128001, 128009]},
//    "generation_config": "<generation_config.json's text, byte for byte>"}
//
// An empty object: none (a model trained from scratch, or a checkpoint without them).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace loom::models::hf {

// The settings of the Hugging Face checkpoint at `path` (a folder, or a .safetensors file with
// config.json beside it); an empty object when it has neither file. Throws naming the file when
// one is unreadable.
nlohmann::json read_token_settings(const std::string& path);

// Writes `settings` beside `save`, a .safetensors file whose config.json was written: the token
// ids merged into that config.json, generation_config.json as recorded (atomically, each).
// Nothing for an empty object; throws naming what is malformed.
void write_token_settings(const nlohmann::json& settings, const std::string& save);

// Copies the tokenizer file to tokenizer.json in the folder of `save`, atomically (nothing when
// it is that file): the model's own tokenizer travels with it. Throws naming an unreadable file.
void copy_tokenizer_beside(const std::string& tokenizer, const std::string& save);

}  // namespace loom::models::hf

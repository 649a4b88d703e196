#include "train/job_command_line.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/family.h"
#include "train/job_model.h"
#include "train/launch.h"

namespace loom::train {

namespace {

// argv with each "--name=" of an option that takes a value (`value_flags`: an empty value, as
// `--name ""` is) split into "--name" and "": CLI11 reads "--name=" as no value and takes the next
// argument as it (`--metrics-out= --steps 1` was refused as an unexpected "1"). A true/false flag's
// "--name=" is left to CLI11, which names it.
std::vector<std::string> with_explicit_empty_values(int argc, char** argv,
                                                    const std::set<std::string>& value_flags) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i > 0 && arg.size() > 3 && arg.starts_with("--") && arg.back() == '=' &&
        arg.find('=') == arg.size() - 1 && value_flags.contains(arg.substr(0, arg.size() - 1))) {
      args.push_back(arg.substr(0, arg.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(arg);
    }
  }
  return args;
}

}  // namespace

CommandLine parse_command_line(int argc, char** argv, const std::string& description) {
  CLI::App app{description +
               " Settings come from the defaults, then --config FILE (TOML, sections as below), "
               "then the flags given."};
  std::string config_file;
  app.add_option("--config", config_file,
                 "TOML job file: [model], [parallel], [training], [comm], [data], [checkpoint], "
                 "[output], [plan]; flags on the command line override it");
  CommandLine parsed;
  app.add_option("--launcher", parsed.launcher,
                 "loomrun, used to start the ranks when not launched");
  app.add_flag("--plan", parsed.plan,
               "validate the job and trace a step of it on the meta device: each rank's memory, "
               "FLOPs, communication and the step time, starting no rank (./loom plan; "
               "train/job_plan.h)");
  app.add_flag("--calibrate", parsed.calibrate,
               "with --plan: measure this machine's GEMM rate and Gloo latency and bandwidth "
               "for the step-time model, store them (train/step_time_model.h) and exit");
  const auto options = job_options();
  const JobConfig defaults;
  std::vector<std::optional<std::string>> raw(options.size());  // nullopt: not given
  // A true/false flag's value: "true" (--flag), "false" (--no-flag), or what --flag=VALUE gave
  // (checked below: true or false). The last one given wins, as for every other option.
  std::vector<std::string> flag_values(options.size());
  std::vector<CLI::Option*> flags(options.size(), nullptr);
  for (size_t i = 0; i < options.size(); ++i) {
    const JobOption& o = options[i];
    // --model lists what this program registered (its families' presets).
    const std::string registered =
        o.key == "model" ? fmt::format(": {}", models::registered_models()) : "";
    const std::string help = fmt::format("{}{}; default {} ([{}] {})", o.help, registered,
                                         option_toml(defaults, o), o.section, o.key);
    if (o.is_bool()) {
      // One CLI11 flag with its negation: `--no-x --x` is true, `--x=false` false. Two flags
      // with callbacks had run in declaration order (the --no- form always won) and ignored
      // `=false`.
      flags[i] = app.add_flag(fmt::format("{}{{true}},!--no-{}", o.flag(), o.flag().substr(2)),
                              flag_values[i], help)
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    } else {
      const char* type = std::holds_alternative<int64_t JobConfig::*>(o.field)  ? "INT"
                         : std::holds_alternative<double JobConfig::*>(o.field) ? "FLOAT"
                                                                                : "TEXT";
      // An empty value is a value (--metrics-out "": none), the table checks it.
      app.add_option_function<std::string>(
             o.flag(), [&raw, i](const std::string& value) { raw[i] = value; }, help)
          ->type_name(type)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  std::set<std::string> value_flags = {"--config", "--launcher"};
  for (const JobOption& o : options) {
    if (!o.is_bool()) value_flags.insert(o.flag());
  }
  std::vector<std::string> args = with_explicit_empty_values(argc, argv, value_flags);
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    parsed.help = true;
    return parsed;
  } catch (const CLI::ExtrasError&) {
    // `--plot-out --metrics-out= ...`: CLI11 gives --plot-out the next flag as its value, and the
    // empty value meant for that flag is left over. Name the option that lost its value.
    for (size_t k = 2; k < args.size(); ++k) {
      LOOM_CHECK(
          !(args[k].empty() && value_flags.contains(args[k - 2]) && args[k - 1].starts_with("--")),
          "{}: got '{}', which is a flag, not a value; give the value (\"\" for none: {} "
          "\"\")",
          args[k - 2], args[k - 1], args[k - 2]);
    }
    throw;
  }
  for (size_t i = 0; i < options.size(); ++i) {
    if (flags[i] != nullptr && flags[i]->count() > 0) raw[i] = flag_values[i];
  }
  parsed.job.model.clear();  // not given: --init-from's family, else the default (below)
  if (!config_file.empty()) load_job_toml(parsed.job, config_file);
  parsed.job.config_file = config_file;
  for (size_t i = 0; i < options.size(); ++i) {
    if (raw[i]) set_option(parsed.job, options[i], *raw[i], options[i].flag());
  }
  if (parsed.job.model.empty()) {
    parsed.job.model = model_of_init_from(parsed.job.init_from, defaults.model);
  }
  // A search lays out --nproc's ranks itself: the degrees given beside it need not make them.
  // Under a launcher its world decides --dp-shard -1 (launch.h: torchrun's, mpirun's, srun's).
  if (!parsed.job.search) {
    resolve_parallel_degrees(parsed.job, launched_as_rank() ? launched_world_size() : 0);
  }
  return parsed;
}

}  // namespace loom::train

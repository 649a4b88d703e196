// `bazel run //tools/...:tool -- relative/path` starts the tool in its runfiles folder, not in
// the folder the user ran bazel from: relative paths would name files nobody meant. Bazel says
// where the user was in BUILD_WORKING_DIRECTORY; a tool that takes paths goes there first (as
// Bazel's own tools such as buildifier do). Without the variable (the tool run directly) nothing
// changes.
#pragma once

namespace loom {

// chdir to $BUILD_WORKING_DIRECTORY when it is set, then unset it (the children started from here
// inherit the folder); throws loom::Error naming it when it cannot.
void enter_bazel_working_directory();

}  // namespace loom

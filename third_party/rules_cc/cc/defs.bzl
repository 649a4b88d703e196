"""Forwards to Bazel 4.2.3's native C++ rules (offline stand-in for rules_cc)."""

cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_import = native.cc_import
cc_proto_library = native.cc_proto_library
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
fdo_profile = native.fdo_profile

#!/bin/sh
echo "coverage tools are not available in Loom's offline build" >&2
exit 1

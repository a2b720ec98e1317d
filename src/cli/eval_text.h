// The evaluation text and path display shared by the commands that run a model over a text
// (`kvq eval fidelity`, `kvq eval attention`, `kvq plan --auto`): the bundled text's location, reading -f, and paths
// printed relative to the working directory.
#pragma once

#include <string>

#include "kvq/status.h"

namespace kvq::cli {

/// The bundled evaluation text: data/eval/ beside the source tree's models/ (when run from a build
/// folder), else ./data/eval/.
std::string BundledEvalText();

/// A path as printed in tables and JSON: relative to the working directory when it lies below it,
/// so a table in the docs does not carry one machine's absolute paths.
std::string DisplayPath(const std::string& path);

/// The whole of text file `path` (-f); the error names -f, the file and what was wrong (missing,
/// not a regular file, unreadable, empty).
Result<std::string> ReadEvalText(const std::string& path);

}  // namespace kvq::cli

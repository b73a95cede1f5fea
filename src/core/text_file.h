// Whole files named by the user (templates, calibration and prompt text, tokenizer and config JSON). A
// directory opens as an empty stream on Linux, so `--template DIR` rendered an empty template without a word;
// here it is refused by name. Pipes and /dev/stdin read as usual.
#pragma once

#include <string>
#include <string_view>

namespace inferx {

// The file's bytes, or inferx::Error "PATH: cannot open WHAT" / "PATH: WHAT is a directory" /
// "PATH: read failed". WHAT names the file's role ("the chat template", "the text file").
std::string read_text_file(const std::string& path, std::string_view what);

}  // namespace inferx

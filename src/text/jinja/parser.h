#pragma once
// Recursive-descent parser for Jinja2 templates, following the grammar (and operator precedence) of
// jinja2/parser.py: condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < postfix/filters.
#include <string>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace inferx::jinja {

// Parses `source` into a Scope node holding the top-level statements. Throws inferx::Error
// "NAME:LINE:COL: message" on syntax errors. Nesting deeper than `max_depth` is a syntax error too, so
// hostile templates cannot overflow the stack.
NodePtr parse_template(const std::string& source, const std::string& name, int max_depth = 500);

}  // namespace inferx::jinja

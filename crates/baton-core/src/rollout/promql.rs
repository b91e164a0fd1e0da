//! A metric guard's query as a template: `{{model}}`, `{{version}}` and
//! `{{window}}` filled in for one side.
//!
//! A model's name comes from the repository, and a directory's name may
//! hold quotes, braces, spaces: written into the query as it is, it could
//! close a string and make another query. So `{{model}}` is allowed only
//! inside a double-quoted PromQL string (a label's value, as in
//! `model="{{model}}"`), where it is escaped as PromQL requires (backslash,
//! double quote, control characters); inside the string of a regular
//! expression matcher (`=~`, `!~`) it is also quoted as a literal, so that
//! `ranker.v2` matches only itself. A query with `{{model}}` anywhere else
//! (outside a string, in a single-quoted or raw string) is refused when the
//! rollout starts. `{{version}}` (a number) and `{{window}}` (a duration
//! such as `30000ms`) cannot change a query's shape and may stand anywhere.

/// The placeholder a model's name takes.
const MODEL: &str = "{{model}}";

/// Where the lexer stands in a query.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    Code,
    /// In a string opened by this quote; `regex`: a regular expression
    /// matcher's.
    String {
        quote: u8,
        regex: bool,
    },
    Comment,
}

/// How `{{model}}` is written where it stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Label,
    Regex,
}

/// The places of `{{model}}` in `query`, each with how it is escaped, or
/// why the query cannot take a model's name safely.
fn places(query: &str) -> Result<Vec<(usize, Context)>, String> {
    let bytes = query.as_bytes();
    let mut at = At::Code;
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(MODEL.as_bytes()) {
            match at {
                At::String { quote: b'"', regex } => {
                    found.push((i, if regex { Context::Regex } else { Context::Label }));
                    i += MODEL.len();
                    continue;
                }
                _ => {
                    return Err(format!(
                        "{MODEL} may only stand inside a double-quoted label value, as in model=\"{MODEL}\" (a model's \
                         name is escaped there); it stands at byte {i} of the query"
                    ));
                }
            }
        }
        let byte = bytes[i];
        at = match at {
            At::Code => match byte {
                b'"' | b'\'' | b'`' => At::String { quote: byte, regex: matcher_is_regex(&bytes[..i]) },
                b'#' => At::Comment,
                _ => At::Code,
            },
            At::String { quote, .. } if byte == b'\\' && quote != b'`' => {
                // The escaped character is part of the string.
                i += 1;
                at
            }
            At::String { quote, .. } if byte == quote => At::Code,
            At::Comment if byte == b'\n' => At::Code,
            other => other,
        };
        i += 1;
    }
    Ok(found)
}

/// Whether the string about to open after `before` is a regular
/// expression matcher's value (`=~` or `!~`, then spaces).
fn matcher_is_regex(before: &[u8]) -> bool {
    let trimmed = before.trim_ascii_end();
    trimmed.ends_with(b"=~") || trimmed.ends_with(b"!~")
}

/// Refuses a query in which a model's name could change the query's shape.
pub fn check(query: &str) -> Result<(), String> {
    places(query).map(drop)
}

/// The query for one side: `{{model}}` escaped where it stands,
/// `{{version}}` and `{{window}}` written out. An error for a query
/// [`check`] refuses.
pub fn fill(query: &str, model: &str, version: u64, window_ms: u64) -> Result<String, String> {
    let places = places(query)?;
    let mut out = String::with_capacity(query.len() + model.len());
    let mut from = 0;
    for (at, context) in places {
        out.push_str(&query[from..at]);
        match context {
            Context::Label => escape_into(&mut out, model),
            Context::Regex => escape_into(&mut out, &quote_regex(model)),
        }
        from = at + MODEL.len();
    }
    out.push_str(&query[from..]);
    Ok(out.replace("{{version}}", &version.to_string()).replace("{{window}}", &format!("{window_ms}ms")))
}

/// `text` as the inside of a double-quoted PromQL string.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
}

/// `text` as a regular expression (RE2, as Prometheus reads one) that
/// matches exactly `text`.
fn quote_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_quotes_stays_inside_its_string() {
        let query = "shop_ctr{model=\"{{model}}\",version=\"{{version}}\"}[{{window}}]";
        let filled = fill(query, "x\"} or vector(1) or up{a=\"\\\n", 2, 3000).unwrap();
        assert_eq!(filled, "shop_ctr{model=\"x\\\"} or vector(1) or up{a=\\\"\\\\\\n\",version=\"2\"}[3000ms]");
        assert_eq!(fill(query, "ranker", 7, 10).unwrap(), "shop_ctr{model=\"ranker\",version=\"7\"}[10ms]");
    }

    #[test]
    fn a_regex_matcher_matches_the_name_and_nothing_else() {
        let filled = fill("up{job=~\"{{model}}|other\", m !~ \"{{model}}\"}", "a.b(c)", 1, 1).unwrap();
        assert_eq!(filled, "up{job=~\"a\\\\.b\\\\(c\\\\)|other\", m !~ \"a\\\\.b\\\\(c\\\\)\"}");
    }

    #[test]
    fn the_name_anywhere_but_a_double_quoted_string_is_refused() {
        for query in [
            "{{model}}_requests_total",
            "up{model='{{model}}'}",
            "up{model=`{{model}}`}",
            "up # {{model}}\n",
            "up{a=\"\\\"\"} + {{model}}",
        ] {
            assert!(check(query).unwrap_err().contains("double-quoted"), "{query}");
            assert!(fill(query, "m", 1, 1).is_err(), "{query}");
        }
        for query in ["up{model=\"{{model}}\"}", "up{a='x\"'} + on() up{model=\"{{model}}\"}", "up{{{version}}}"] {
            assert!(check(query).is_ok(), "{query}");
        }
    }
}

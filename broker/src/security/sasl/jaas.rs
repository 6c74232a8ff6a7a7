//! Kafka's JAAS configuration syntax, as `sasl.jaas.config` carries it:
//!
//! ```text
//! org.apache.kafka.common.security.plain.PlainLoginModule required
//!     username="admin" password="admin-secret" user_alice="alice-secret";
//! ```
//!
//! Kafka parses this with `java.io.StreamTokenizer` (its `JaasConfig`), so the
//! tokenizer here follows StreamTokenizer's rules: words of letters, digits,
//! `.`, `-`, `_` and `$`; single- or double-quoted strings with Java escapes,
//! ending at the closing quote or the end of the line; `//`, `/* */` and lone
//! `/` comments; a token that starts with a digit or `.` is a number, which
//! has no string value and so cannot be a key or a value. Error messages are
//! Kafka's.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::str::Chars;

/// One login module of a JAAS configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct LoginModuleEntry {
    /// The login module's class name, e.g.
    /// `org.apache.kafka.common.security.plain.PlainLoginModule`.
    pub login_module: String,
    pub control_flag: ControlFlag,
    pub options: BTreeMap<String, String>,
}

impl std::fmt::Debug for LoginModuleEntry {
    /// Option values hold passwords (`user_alice="..."`), so only the keys
    /// are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginModuleEntry")
            .field("login_module", &self.login_module)
            .field("control_flag", &self.control_flag)
            .field("option_keys", &self.options.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// JAAS's control flag. Kafka accepts all four and the broker treats them
/// alike (there is one module per mechanism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlFlag {
    Required,
    Requisite,
    Sufficient,
    Optional,
}

/// Why a JAAS configuration did not parse, in Kafka's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JaasError(pub String);

/// Parses a JAAS configuration into its login modules (at least one).
pub fn parse(text: &str) -> Result<Vec<LoginModuleEntry>, JaasError> {
    let mut tokens = Tokenizer::new(text);
    let mut entries = Vec::new();
    loop {
        let first = tokens.next_token();
        if first == Token::Eof {
            break;
        }
        entries.push(parse_entry(first, &mut tokens)?);
    }
    if entries.is_empty() {
        return Err(JaasError(
            "Login module not specified in JAAS config".to_owned(),
        ));
    }
    Ok(entries)
}

/// Parses `sasl.jaas.config`, which must hold exactly one login module
/// (Kafka's `JaasContext` for a config property).
pub fn parse_single(text: &str) -> Result<LoginModuleEntry, JaasError> {
    let mut entries = parse(text)?;
    if entries.len() != 1 {
        return Err(JaasError(format!(
            "JAAS config property contains {} login modules, should be 1 module",
            entries.len()
        )));
    }
    Ok(entries.remove(0))
}

fn parse_entry(first: Token, tokens: &mut Tokenizer<'_>) -> Result<LoginModuleEntry, JaasError> {
    let login_module = first
        .into_string()
        .ok_or_else(|| JaasError("Login module not specified in JAAS config".to_owned()))?;
    let flag = tokens.next_token();
    if flag == Token::Eof {
        return Err(JaasError(
            "Login module control flag not specified in JAAS config".to_owned(),
        ));
    }
    let control_flag = control_flag(flag.into_string())?;
    let mut options = BTreeMap::new();
    let mut token = tokens.next_token();
    while token != Token::Eof && token != Token::Char(';') {
        // Kafka would store a number or a symbol as a null key; there is
        // no use for one, so it is refused as a missing key.
        let key = token.into_string().ok_or_else(|| {
            JaasError("Value not specified for key 'null' in JAAS config".to_owned())
        })?;
        let value = match (tokens.next_token(), tokens.next_token()) {
            (Token::Char('='), value) => value.into_string(),
            _ => None,
        };
        let Some(value) = value else {
            return Err(JaasError(format!(
                "Value not specified for key '{key}' in JAAS config"
            )));
        };
        options.insert(key, value);
        token = tokens.next_token();
    }
    if token != Token::Char(';') {
        return Err(JaasError(
            "JAAS config entry not terminated by semi-colon".to_owned(),
        ));
    }
    Ok(LoginModuleEntry {
        login_module,
        control_flag,
        options,
    })
}

fn control_flag(flag: Option<String>) -> Result<ControlFlag, JaasError> {
    let Some(flag) = flag else {
        return Err(JaasError(
            "Login module control flag is not available in the JAAS config".to_owned(),
        ));
    };
    match flag.to_ascii_uppercase().as_str() {
        "REQUIRED" => Ok(ControlFlag::Required),
        "REQUISITE" => Ok(ControlFlag::Requisite),
        "SUFFICIENT" => Ok(ControlFlag::Sufficient),
        "OPTIONAL" => Ok(ControlFlag::Optional),
        _ => Err(JaasError(format!(
            "Invalid login module control flag '{flag}' in JAAS config"
        ))),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    /// StreamTokenizer's TT_NUMBER: it has no string value.
    Number,
    /// Any other single character (`=`, `;`, ...).
    Char(char),
    Eof,
}

impl Token {
    /// StreamTokenizer's `sval`: only words and quoted strings have one.
    fn into_string(self) -> Option<String> {
        match self {
            Token::Word(s) | Token::Quoted(s) => Some(s),
            Token::Number | Token::Char(_) | Token::Eof => None,
        }
    }
}

struct Tokenizer<'a> {
    chars: Peekable<Chars<'a>>,
}

impl<'a> Tokenizer<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            chars: text.chars().peekable(),
        }
    }

    fn next_token(&mut self) -> Token {
        loop {
            let Some(c) = self.chars.next() else {
                return Token::Eof;
            };
            match c {
                c if c <= ' ' => continue,
                '/' => match self.chars.peek() {
                    Some('*') => {
                        self.chars.next();
                        self.skip_block_comment();
                    }
                    // `//` and, as StreamTokenizer's default comment
                    // character, a lone `/` both comment out the line.
                    _ => self.skip_line(),
                },
                '"' | '\'' => return Token::Quoted(self.quoted(c)),
                c if is_word_start(c) => {
                    let mut word = String::from(c);
                    while let Some(&next) = self.chars.peek() {
                        if !is_word_start(next) && !is_number_char(next) {
                            break;
                        }
                        word.push(next);
                        self.chars.next();
                    }
                    return Token::Word(word);
                }
                c if is_number_char(c) => {
                    while self.chars.peek().is_some_and(|&n| is_number_char(n)) {
                        self.chars.next();
                    }
                    return Token::Number;
                }
                c => return Token::Char(c),
            }
        }
    }

    fn skip_line(&mut self) {
        for c in self.chars.by_ref() {
            if c == '\n' || c == '\r' {
                break;
            }
        }
    }

    fn skip_block_comment(&mut self) {
        let mut star = false;
        for c in self.chars.by_ref() {
            if star && c == '/' {
                return;
            }
            star = c == '*';
        }
    }

    /// A quoted string with StreamTokenizer's escapes: `\a \b \f \n \r \t
    /// \v`, octal `\0`..`\377`, and `\c` for any other `c`. The string
    /// ends at the matching quote, a line break or the end of the input.
    fn quoted(&mut self, quote: char) -> String {
        let mut out = String::new();
        while let Some(c) = self.chars.next() {
            match c {
                c if c == quote => break,
                '\n' | '\r' => break,
                '\\' => {
                    let Some(e) = self.chars.next() else { break };
                    let unescaped = match e {
                        'a' => '\u{7}',
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        'v' => '\u{b}',
                        '0'..='7' => self.octal(e),
                        other => other,
                    };
                    out.push(unescaped);
                }
                c => out.push(c),
            }
        }
        out
    }

    /// Up to three octal digits when the first is 0..=3 (so at most
    /// `\377`), else up to two, as StreamTokenizer reads them.
    fn octal(&mut self, first: char) -> char {
        let max_digits = if first <= '3' { 3 } else { 2 };
        let mut value = first as u32 - '0' as u32;
        for _ in 1..max_digits {
            match self.chars.peek() {
                Some(&d @ '0'..='7') => {
                    value = value * 8 + (d as u32 - '0' as u32);
                    self.chars.next();
                }
                _ => break,
            }
        }
        // At most 0o377, which fits a byte.
        char::from(value as u8)
    }
}

/// StreamTokenizer's word characters: ASCII letters, Latin-1 letters
/// (0xA0..=0xFF), anything beyond Latin-1, and the `-`, `_` and `$` Kafka
/// adds.
fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c >= '\u{a0}' || matches!(c, '-' | '_' | '$')
}

/// StreamTokenizer's number characters (which also continue a word).
fn is_number_char(c: char) -> bool {
    c.is_ascii_digit() || c == '.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(entry: &LoginModuleEntry) -> Vec<(&str, &str)> {
        entry
            .options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn plain_login_module_with_users() {
        let entry = parse_single(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required
               username="admin" password="admin-secret"
               user_admin="admin-secret" user_alice="alice-secret";"#,
        )
        .unwrap();
        assert_eq!(
            entry.login_module,
            "org.apache.kafka.common.security.plain.PlainLoginModule"
        );
        assert_eq!(entry.control_flag, ControlFlag::Required);
        assert_eq!(
            options(&entry),
            vec![
                ("password", "admin-secret"),
                ("user_admin", "admin-secret"),
                ("user_alice", "alice-secret"),
                ("username", "admin"),
            ]
        );
    }

    #[test]
    fn control_flags_are_case_insensitive() {
        for (text, flag) in [
            ("M REQUIRED;", ControlFlag::Required),
            ("M requisite;", ControlFlag::Requisite),
            ("M Sufficient;", ControlFlag::Sufficient),
            ("M optional;", ControlFlag::Optional),
        ] {
            assert_eq!(parse_single(text).unwrap().control_flag, flag, "{text}");
        }
    }

    #[test]
    fn quotes_escapes_and_unquoted_words() {
        let entry = parse_single(
            r#"M required a="x\"y\\z" b='single "inner"' c=bare-word_1$ d="\t\n\101\7" e="";"#,
        )
        .unwrap();
        assert_eq!(
            options(&entry),
            vec![
                ("a", "x\"y\\z"),
                ("b", "single \"inner\""),
                ("c", "bare-word_1$"),
                ("d", "\t\nA\u{7}"),
                ("e", ""),
            ]
        );
    }

    #[test]
    fn comments_are_skipped() {
        let entry = parse_single(
            "// leading comment\nM /* block\n comment */ required\n a=\"1\" // trailing\n;",
        )
        .unwrap();
        assert_eq!(options(&entry), vec![("a", "1")]);
    }

    #[test]
    fn non_ascii_values() {
        let entry = parse_single("M required user_jürgen=\"pässwörd\";").unwrap();
        assert_eq!(options(&entry), vec![("user_jürgen", "pässwörd")]);
    }

    #[test]
    fn several_modules_parse_but_the_property_takes_one() {
        let text = "A required; B optional x=\"y\";";
        assert_eq!(parse(text).unwrap().len(), 2);
        assert_eq!(
            parse_single(text).unwrap_err().0,
            "JAAS config property contains 2 login modules, should be 1 module"
        );
    }

    #[test]
    fn kafka_error_messages() {
        for (text, message) in [
            ("", "Login module not specified in JAAS config"),
            (
                "   // only a comment",
                "Login module not specified in JAAS config",
            ),
            (
                "M",
                "Login module control flag not specified in JAAS config",
            ),
            (
                "M ;",
                "Login module control flag is not available in the JAAS config",
            ),
            (
                "M mandatory;",
                "Invalid login module control flag 'mandatory' in JAAS config",
            ),
            (
                "M required a;",
                "Value not specified for key 'a' in JAAS config",
            ),
            (
                "M required a=;",
                "Value not specified for key 'a' in JAAS config",
            ),
            (
                "M required a=",
                "Value not specified for key 'a' in JAAS config",
            ),
            // A number has no string value, as in StreamTokenizer.
            (
                "M required a=123;",
                "Value not specified for key 'a' in JAAS config",
            ),
            (
                "M required a:\"b\";",
                "Value not specified for key 'a' in JAAS config",
            ),
            (
                "M required a=\"b\"",
                "JAAS config entry not terminated by semi-colon",
            ),
            (
                "M required =\"b\";",
                "Value not specified for key 'null' in JAAS config",
            ),
        ] {
            assert_eq!(parse_single(text).unwrap_err().0, message, "{text:?}");
        }
    }

    #[test]
    fn debug_hides_option_values() {
        let entry = parse_single("M required user_a=\"secret\";").unwrap();
        let debug = format!("{entry:?}");
        assert!(debug.contains("user_a"), "{debug}");
        assert!(!debug.contains("secret"), "{debug}");
    }

    #[test]
    fn unterminated_quote_ends_at_line_break() {
        let entry = parse_single("M required a=\"open\n;").unwrap();
        assert_eq!(options(&entry), vec![("a", "open")]);
    }
}

//! The AWS shared files, `~/.aws/credentials` and `~/.aws/config`: the
//! middle link of the usual credential chain (environment, then profile,
//! then the container or instance metadata), which the object store
//! library does not read itself.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a profile says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// `aws_access_key_id`.
    pub access_key_id: Option<String>,
    /// `aws_secret_access_key`.
    pub secret_access_key: Option<String>,
    /// `aws_session_token`.
    pub session_token: Option<String>,
    /// `region`.
    pub region: Option<String>,
}

/// The profile `AWS_PROFILE` names (`default` without it), from the files
/// `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` name (under `~/.aws`
/// without them). Files that are absent or unreadable say nothing.
pub fn from_env() -> Profile {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let home = var("HOME").map(PathBuf::from).unwrap_or_default();
    let credentials = var("AWS_SHARED_CREDENTIALS_FILE").map(PathBuf::from).unwrap_or(home.join(".aws/credentials"));
    let config = var("AWS_CONFIG_FILE").map(PathBuf::from).unwrap_or(home.join(".aws/config"));
    let name = var("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    read_profile(&name, &read(credentials), &read(config))
}

/// The profile `name` from the two files' text: the credentials file's
/// `[name]` section first, then the config file's `[profile name]` (or
/// `[default]`) section.
pub fn read_profile(name: &str, credentials: &str, config: &str) -> Profile {
    let in_credentials = sections(credentials).remove(name).unwrap_or_default();
    let config_section = if name == "default" { "default".to_owned() } else { format!("profile {name}") };
    let in_config = sections(config).remove(&config_section).unwrap_or_default();
    let get = |key: &str| in_credentials.get(key).or_else(|| in_config.get(key)).cloned();
    Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: get("region"),
    }
}

/// An INI text as sections of keys and values.
fn sections(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(name.trim().to_owned());
        } else if let (Some(section), Some((key, value))) = (&current, line.split_once('=')) {
            let entry = out.entry(section.clone()).or_default();
            entry.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_profile_reads_from_both_files() {
        let credentials = "[default]\naws_access_key_id = AKD\naws_secret_access_key = sd\n\n\
                           # a comment\n[ci]\nAWS_ACCESS_KEY_ID=AKC\naws_secret_access_key=sc\naws_session_token = t\n";
        let config = "[default]\nregion = eu-west-1\n[profile ci]\nregion = us-east-2\n[ci]\nregion = wrong\n";
        let ci = read_profile("ci", credentials, config);
        assert_eq!(ci.access_key_id.as_deref(), Some("AKC"));
        assert_eq!(ci.secret_access_key.as_deref(), Some("sc"));
        assert_eq!(ci.session_token.as_deref(), Some("t"));
        assert_eq!(ci.region.as_deref(), Some("us-east-2"), "config sections other than default say `profile`");
        let default = read_profile("default", credentials, config);
        assert_eq!(default.access_key_id.as_deref(), Some("AKD"));
        assert_eq!(default.region.as_deref(), Some("eu-west-1"));
        assert_eq!(read_profile("absent", credentials, config), Profile::default());
    }
}

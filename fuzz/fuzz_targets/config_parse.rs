//! The configuration parser on arbitrary text: it must answer every input with a configuration
//! or an error, never a panic, and a configuration it accepts must print as TOML that loads
//! back to the same configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = Config::from_toml_str(text) {
        let printed = config.to_toml();
        let again = Config::from_toml_str(&printed).expect("printed configuration loads");
        assert_eq!(again, config, "round trip changed the configuration");
    }
});

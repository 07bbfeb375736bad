//! toolgate.lock parsing of arbitrary text. Properties: `parse` never panics; when it accepts a
//! file, rendering the result parses back to an equal lockfile and rendering is a fixed point
//! (render -> parse -> render gives the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolgate_contract::lockfile::Lockfile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(lockfile) = Lockfile::parse(text) else {
        return;
    };
    let rendered = lockfile.render();
    let again = match Lockfile::parse(&rendered) {
        Ok(lockfile) => lockfile,
        Err(e) => panic!("the rendering of an accepted lockfile does not parse: {e}\n{rendered}"),
    };
    assert_eq!(
        again, lockfile,
        "parse -> render -> parse changed the lockfile"
    );
    assert_eq!(again.render(), rendered, "rendering is not a fixed point");
    assert_eq!(again.integrity_digest(), lockfile.integrity_digest());
});

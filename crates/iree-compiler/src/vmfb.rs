//! Recognizing a compiled IREE VM module (vmfb) by its bytes.
//!
//! IREE 3.13 writes a vmfb as a "polyglot" ZIP: a ZIP local file header for `module.fb`
//! (padded so the payload is aligned), then the module flatbuffer stored uncompressed, then
//! the ZIP directory. The flatbuffer is size-prefixed: bytes 0..4 its length, 4..8 the root
//! table offset, 8..12 the file identifier `IREE`. With `--iree-vm-emit-polyglot-zip=false`
//! the file is that bare flatbuffer.

use crate::error::Error;

/// The flatbuffer file identifier of `iree.vm.BytecodeModuleDef`.
pub const VMFB_IDENTIFIER: &[u8; 4] = b"IREE";

const ZIP_LOCAL_HEADER: &[u8; 4] = b"PK\x03\x04";
/// Fixed part of a ZIP local file header, before the name and extra field.
const ZIP_LOCAL_HEADER_LEN: usize = 30;

/// Byte offset of the module flatbuffer inside `bytes` (0 for a bare flatbuffer).
pub fn flatbuffer_offset(bytes: &[u8]) -> Result<usize, Error> {
    let start = if bytes.starts_with(ZIP_LOCAL_HEADER) {
        if bytes.len() < ZIP_LOCAL_HEADER_LEN {
            return Err(Error::NotVmfb(format!("truncated ZIP header ({} bytes)", bytes.len())));
        }
        let name_len = u16::from_le_bytes([bytes[26], bytes[27]]) as usize;
        let extra_len = u16::from_le_bytes([bytes[28], bytes[29]]) as usize;
        ZIP_LOCAL_HEADER_LEN + name_len + extra_len
    } else {
        0
    };
    match bytes.get(start + 8..start + 12) {
        Some(id) if id == VMFB_IDENTIFIER => Ok(start),
        Some(id) => Err(Error::NotVmfb(format!(
            "expected flatbuffer identifier \"IREE\" at byte {}, found {:?}",
            start + 8,
            String::from_utf8_lossy(id)
        ))),
        None => Err(Error::NotVmfb(format!("only {} bytes", bytes.len()))),
    }
}

/// Checks that `bytes` look like a vmfb (ZIP-wrapped or bare) carrying the `IREE` identifier.
pub fn check_vmfb(bytes: &[u8]) -> Result<(), Error> {
    flatbuffer_offset(bytes).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_zip_forms() {
        let mut bare = vec![0x1c, 0x18, 0, 0, 0x0c, 0, 0, 0];
        bare.extend_from_slice(b"IREE");
        bare.extend_from_slice(&[0; 8]);
        assert_eq!(flatbuffer_offset(&bare).unwrap(), 0);

        // ZIP local header with a 9-byte name and a 25-byte extra field, as IREE writes it.
        let mut zip = b"PK\x03\x04".to_vec();
        zip.resize(26, 0);
        zip.extend_from_slice(&9u16.to_le_bytes());
        zip.extend_from_slice(&25u16.to_le_bytes());
        zip.extend_from_slice(b"module.fb");
        zip.extend_from_slice(&[0; 25]);
        assert_eq!(zip.len(), 64);
        zip.extend_from_slice(&bare);
        assert_eq!(flatbuffer_offset(&zip).unwrap(), 64);

        let err = check_vmfb(b"PK\x03\x04short").unwrap_err().to_string();
        assert!(err.contains("truncated ZIP header"), "{err}");
        let err = check_vmfb(b"0123456789abcdef").unwrap_err().to_string();
        assert!(err.contains("found \"89ab\""), "{err}");
        assert!(check_vmfb(b"").is_err());
    }
}

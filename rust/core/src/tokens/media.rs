//! Media costs by the published rules: images (tiles), files (inline text, PDF pages, by
//! reference) and audio (seconds). Base64 is never counted as text.

use base64::Engine;
use serde_json::{Map, Value};

use super::{Encoding, TokenError};

/// `detail: "low"` image cost, and the base cost of every high-detail image.
pub const IMAGE_BASE_TOKENS: u64 = 85;
/// Cost of one 512x512 tile of a high-detail image.
pub const IMAGE_TILE_TOKENS: u64 = 170;
/// Largest possible high-detail image cost (768x2048 after scaling: 8 tiles).
pub const IMAGE_MAX_TOKENS: u64 = IMAGE_BASE_TOKENS + 8 * IMAGE_TILE_TOKENS;
/// Page image of a PDF page (a letter page rendered at high detail: 4 tiles).
pub const PDF_PAGE_IMAGE_TOKENS: u64 = IMAGE_BASE_TOKENS + 4 * IMAGE_TILE_TOKENS;
/// Extracted text of one PDF page (a dense page of prose).
pub const PDF_TEXT_TOKENS_PER_PAGE: u64 = 1000;
/// A file whose bytes are not in the request (by `file_id` or `file_url`).
pub const UNKNOWN_FILE_TOKENS: u64 = 4096;
/// Audio tokens per second of input audio.
pub const AUDIO_TOKENS_PER_SECOND: f64 = 10.0;

/// Media parts: `Some(tokens)` when `map` is an image, file or audio part.
pub(super) fn media_cost(
    map: &Map<String, Value>,
    enc: Encoding,
    path: &str,
) -> Result<Option<u64>, TokenError> {
    let ty = map.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "input_image" | "computer_screenshot" => {
            let detail = map.get("detail").and_then(Value::as_str);
            let url = map.get("image_url").and_then(Value::as_str);
            Ok(Some(image_tokens(detail, url)))
        }
        "image_url" => {
            // Chat Completions shape: {"type":"image_url","image_url":{"url":…,"detail":…}}
            let inner = map.get("image_url");
            let url = inner
                .and_then(|v| v.get("url").and_then(Value::as_str))
                .or_else(|| inner.and_then(Value::as_str));
            let detail = inner.and_then(|v| v.get("detail").and_then(Value::as_str));
            Ok(Some(image_tokens(detail, url)))
        }
        "input_file" => {
            let filename = map.get("filename").and_then(Value::as_str);
            let data = map.get("file_data").and_then(Value::as_str);
            Ok(Some(file_tokens(filename, data, enc, path)?))
        }
        "input_audio" => {
            let data = map
                .get("input_audio")
                .and_then(|v| v.get("data"))
                .or_else(|| map.get("data"))
                .and_then(Value::as_str);
            Ok(Some(audio_tokens(data)))
        }
        _ => Ok(None),
    }
}

/// Split a `data:<mime>;base64,<payload>` URL.
fn split_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some((mime, payload))
}

/// Decode at most `max_chars` base64 characters from the start of `payload`.
fn decode_prefix(payload: &str, max_chars: usize) -> Option<Vec<u8>> {
    let cleaned: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .take(max_chars)
        .collect();
    let usable = cleaned.len() - cleaned.len() % 4;
    let engine = base64::engine::general_purpose::STANDARD;
    engine
        .decode(&cleaned[..usable])
        .ok()
        .or_else(|| engine.decode(cleaned[..usable].trim_end_matches('=')).ok())
}

/// Decode a whole base64 payload (standard or URL-safe alphabet, padding optional).
fn decode_all(payload: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let cleaned: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(&cleaned).ok())
}

/// High-detail cost of an image of `width` x `height` pixels (tile-based models).
pub fn image_tokens_for_size(width: u64, height: u64) -> u64 {
    if width == 0 || height == 0 {
        return IMAGE_BASE_TOKENS;
    }
    let (mut w, mut h) = (width as f64, height as f64);
    let longest = w.max(h);
    if longest > 2048.0 {
        let s = 2048.0 / longest;
        w *= s;
        h *= s;
    }
    let shortest = w.min(h);
    if shortest > 768.0 {
        let s = 768.0 / shortest;
        w *= s;
        h *= s;
    }
    let tiles = (w / 512.0).ceil().max(1.0) * (h / 512.0).ceil().max(1.0);
    IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * tiles as u64
}

/// Cost of an image part by its detail level and (when inline) its real size.
pub fn image_tokens(detail: Option<&str>, url: Option<&str>) -> u64 {
    if detail == Some("low") {
        return IMAGE_BASE_TOKENS;
    }
    let size = url
        .and_then(split_data_url)
        // JPEG headers can sit behind large EXIF blocks; 256 KiB of base64 covers them.
        .and_then(|(_, payload)| decode_prefix(payload, 256 * 1024))
        .and_then(|bytes| imagesize::blob_size(&bytes).ok());
    match size {
        Some(s) => image_tokens_for_size(s.width as u64, s.height as u64),
        None => IMAGE_MAX_TOKENS,
    }
}

fn is_text_mime(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/x-yaml"
                | "application/yaml"
                | "application/javascript"
                | "application/x-python"
                | "application/sql"
        )
}

fn file_tokens(
    filename: Option<&str>,
    data: Option<&str>,
    enc: Encoding,
    path: &str,
) -> Result<u64, TokenError> {
    let Some(data) = data else {
        return Ok(UNKNOWN_FILE_TOKENS);
    };
    let (mime, payload) = split_data_url(data).unwrap_or(("", data));
    let bytes = match decode_all(payload) {
        Some(b) => b,
        None => {
            return Err(TokenError::BadItem {
                field: format!("{path}.file_data"),
                message: "file_data is not valid base64".to_string(),
            })
        }
    };
    let name = filename.unwrap_or("").to_ascii_lowercase();
    if mime == "application/pdf" || name.ends_with(".pdf") || bytes.starts_with(b"%PDF") {
        let pages = count_pdf_pages(&bytes).max(1);
        return Ok(pages * (PDF_PAGE_IMAGE_TOKENS + PDF_TEXT_TOKENS_PER_PAGE));
    }
    if is_text_mime(mime) || std::str::from_utf8(&bytes).is_ok() {
        let text = String::from_utf8_lossy(&bytes);
        return enc.count(&text);
    }
    Ok(UNKNOWN_FILE_TOKENS)
}

/// Count `/Type /Page` objects (not `/Pages`) in a PDF.
fn count_pdf_pages(bytes: &[u8]) -> u64 {
    let needle = b"/Type";
    let mut pages = 0;
    let mut i = 0;
    while i + needle.len() <= bytes.len() {
        if &bytes[i..i + needle.len()] == needle {
            let mut j = i + needle.len();
            while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            if bytes[j..].starts_with(b"/Page") && !bytes[j..].starts_with(b"/Pages") {
                pages += 1;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    pages
}

fn audio_tokens(data: Option<&str>) -> u64 {
    let Some(data) = data else {
        return (60.0 * AUDIO_TOKENS_PER_SECOND) as u64;
    };
    let payload = split_data_url(data).map(|(_, p)| p).unwrap_or(data);
    let approx_bytes = (payload.len() as f64 * 3.0 / 4.0).max(1.0);
    let byte_rate = decode_prefix(payload, 64)
        .filter(|h| h.len() >= 32 && &h[0..4] == b"RIFF" && &h[8..12] == b"WAVE")
        .map(|h| u32::from_le_bytes([h[28], h[29], h[30], h[31]]) as f64)
        .filter(|r| *r > 0.0)
        .unwrap_or(16_000.0);
    (approx_bytes / byte_rate * AUDIO_TOKENS_PER_SECOND).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::canonical;
    use serde_json::json;

    #[test]
    fn image_rules() {
        assert_eq!(image_tokens(Some("low"), None), 85);
        assert_eq!(image_tokens(Some("high"), Some("https://x/y.png")), 1445);
        // Published examples: 1024x1024 high -> 765; 2048x4096 -> 1105.
        assert_eq!(image_tokens_for_size(1024, 1024), 765);
        assert_eq!(image_tokens_for_size(2048, 4096), 1105);
        assert_eq!(image_tokens_for_size(512, 512), 255);
        // A real 1x1 PNG inline: one tile.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
        let url = format!("data:image/png;base64,{png}");
        assert_eq!(image_tokens(Some("auto"), Some(&url)), 255);
        let part = json!({"role":"user","content":[{"type":"input_image","image_url": url, "detail":"high"}]});
        let c = canonical(&part, Encoding::O200kBase).unwrap();
        assert_eq!(c.media_tokens, 255);
        assert!(!c.text.contains("iVBOR"), "base64 is never counted as text");
    }

    #[test]
    fn file_rules() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let text = b64.encode("hello world");
        let item = json!({"type":"input_file","filename":"a.txt","file_data": format!("data:text/plain;base64,{text}")});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(c.media_tokens, 2);
        let pdf = b64.encode(b"%PDF-1.4 1 0 obj << /Type /Pages /Count 2 >> 2 0 obj << /Type /Page >> 3 0 obj << /Type/Page >>");
        let item = json!({"type":"input_file","filename":"a.pdf","file_data": format!("data:application/pdf;base64,{pdf}")});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(
            c.media_tokens,
            2 * (PDF_PAGE_IMAGE_TOKENS + PDF_TEXT_TOKENS_PER_PAGE)
        );
        let item = json!({"type":"input_file","file_id":"file_1"});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(c.media_tokens, UNKNOWN_FILE_TOKENS);
        let bad = json!({"type":"input_file","file_data":"data:application/pdf;base64,@@@@"});
        let err =
            canonical(&json!({"role":"user","content":[bad]}), Encoding::O200kBase).unwrap_err();
        assert!(err.to_string().contains("content[0].file_data"), "{err}");
    }
}

//! Refusals: the catalogue code, and the HTTP answer the package client
//! reads.
//!
//! The codes are airlock's (`crates/proto`'s catalogue, class and all). The
//! status line is the HTTP *proxy*'s answer to a package client, which
//! reads 403, 405, 502 and 504 as a proxy's refusals and failures; the
//! `X-Airlock-Refusal` header and the body carry the code.

use airlock_proto::Code;

/// The proxy's HTTP status for a refusal `code`: the one table.
pub fn proxy_status(code: Code, timed_out: bool) -> (u16, &'static str) {
    match code {
        Code::EGRESS_METHOD_NOT_ALLOWED => (405, "Method Not Allowed"),
        Code::EGRESS_PREAMBLE_INVALID | Code::EGRESS_REQUEST_INVALID => (400, "Bad Request"),
        Code::EGRESS_RESOLVE_FAILED | Code::EGRESS_CONNECT_FAILED if timed_out => {
            (504, "Gateway Timeout")
        }
        Code::EGRESS_RESOLVE_FAILED | Code::EGRESS_CONNECT_FAILED => (502, "Bad Gateway"),
        _ => (403, "Forbidden"),
    }
}

/// The whole response for a refusal: status line, the code's header, the
/// code and its meaning as the body, then the connection closes.
pub fn response(code: Code, timed_out: bool) -> Vec<u8> {
    let (status, text) = proxy_status(code, timed_out);
    let body = format!("{}: {}\n", code.as_str(), code.meaning());
    let allow = if code == Code::EGRESS_METHOD_NOT_ALLOWED {
        "Allow: CONNECT\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status} {text}\r\nX-Airlock-Refusal: {}\r\n{allow}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        code.as_str(),
        body.len()
    )
    .into_bytes()
}

/// The answer to an allowed CONNECT.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_carry_the_code_in_header_and_body() {
        let r = String::from_utf8(response(Code::EGRESS_HOST_NOT_ALLOWED, false)).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("\r\nX-Airlock-Refusal: EGRESS_HOST_NOT_ALLOWED\r\n"));
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(body.starts_with("EGRESS_HOST_NOT_ALLOWED: "));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let r = String::from_utf8(response(Code::EGRESS_METHOD_NOT_ALLOWED, false)).unwrap();
        assert!(r.starts_with("HTTP/1.1 405 ") && r.contains("Allow: CONNECT\r\n"));
        assert_eq!(proxy_status(Code::EGRESS_CONNECT_FAILED, true).0, 504);
        assert_eq!(proxy_status(Code::EGRESS_RESOLVE_FAILED, false).0, 502);
    }
}

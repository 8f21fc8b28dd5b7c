// One step of RSABSSA (RFC 9474) with @cloudflare/blindrsa-ts, for tests/test_blindrsa_interop.py.
// argv: step, variant, then hex arguments; prints a JSON object of hex strings. Keys come as DER (SPKI / PKCS#8).
import { RSABSSA } from "@cloudflare/blindrsa-ts";

const [step, variantName, ...args] = process.argv.slice(2);
const variants = {
  "RSABSSA-SHA384-PSS-Randomized": RSABSSA.SHA384.PSS.Randomized,
  "RSABSSA-SHA384-PSSZERO-Randomized": RSABSSA.SHA384.PSSZero.Randomized,
  "RSABSSA-SHA384-PSS-Deterministic": RSABSSA.SHA384.PSS.Deterministic,
  "RSABSSA-SHA384-PSSZERO-Deterministic": RSABSSA.SHA384.PSSZero.Deterministic,
};
const suite = variants[variantName]();
const hex = (b) => Buffer.from(b).toString("hex");
const bytes = (h) => Uint8Array.from(Buffer.from(h, "hex"));
const algo = { name: "RSA-PSS", hash: "SHA-384" };
const pub = (h) => crypto.subtle.importKey("spki", bytes(h), algo, true, ["verify"]);
const priv = (h) => crypto.subtle.importKey("pkcs8", bytes(h), algo, true, ["sign"]);

let out;
if (step === "blind") { // spki, message → prepared message, blinded message, inv (the client's state, as hex)
  const [spki, msg] = args;
  const prepared = suite.prepare(bytes(msg));
  const { blindedMsg, inv } = await suite.blind(await pub(spki), prepared);
  out = { prepared: hex(prepared), blinded: hex(blindedMsg), inv: hex(inv) };
} else if (step === "finalize") { // spki, prepared, blind signature, inv → signature
  const [spki, prepared, blindSig, inv] = args;
  out = { sig: hex(await suite.finalize(await pub(spki), bytes(prepared), bytes(blindSig), bytes(inv))) };
} else if (step === "sign") { // pkcs8, blinded message → blind signature
  const [pkcs8, blinded] = args;
  out = { blind_sig: hex(await suite.blindSign(await priv(pkcs8), bytes(blinded))) };
} else if (step === "verify") { // spki, prepared, signature → valid
  const [spki, prepared, sig] = args;
  out = { valid: await suite.verify(await pub(spki), bytes(sig), bytes(prepared)) };
} else {
  throw new Error(`unknown step ${step}`);
}
console.log(JSON.stringify(out));

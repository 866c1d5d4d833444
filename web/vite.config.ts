import { defineConfig } from "vite";

// `npm run dev` serves the sources with hot reload and forwards the API to a running
// `trainyard up` (TRAINYARD_API, default http://127.0.0.1:8000).
const api = process.env.TRAINYARD_API ?? "http://127.0.0.1:8000";

export default defineConfig({
  base: "/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    // The editor (CodeMirror) and the charts (uPlot) load with the pages that use them.
    chunkSizeWarningLimit: 700,
  },
  server: { proxy: { "/api": { target: api, changeOrigin: true } } },
});

-- Highlight groups: the plugin's own groups (linked with default = true) and the ANSI groups
-- made lazily from the SGR styles the backend sends. Everything is re-applied on ColorScheme.

local M = {}
local H = {}

--- The plugin's groups and the standard groups they link to.
M.groups = {
  AgentBashHeader = 'Title', -- `$ <command>`
  AgentBashRunning = 'DiagnosticInfo', -- running icon and `Running… (<Esc> to cancel)`
  AgentBashOk = 'DiagnosticOk', -- success icon
  AgentBashError = 'DiagnosticError', -- error icon, `(exit N)`, `Bash command failed: …`
  AgentBashWarning = 'DiagnosticWarn', -- truncation warning, timeout, cancel
  AgentBashDim = 'Comment', -- whole card of a command excluded from context
  AgentBashMore = 'Comment', -- `… N more lines`, `… (K earlier lines …)` hints
  AgentBashNormal = 'NormalFloat', -- card background
  AgentBashBorder = 'FloatBorder', -- card border
  AgentBashTitle = 'FloatTitle', -- card title text
  AgentBashFooter = 'FloatFooter', -- card footer (key hints, `[Timeout: Ns]`)
  AgentBashRescued = 'DiagnosticError', -- rescued lines (diagnostics the window cut off)
  AgentBashArtifactRange = 'Visual', -- the lines `artifact://<id>#L<a>-<b>` points at
}

--- xterm's default colours 0–15, used when `g:terminal_color_N` is not set.
M.palette = {
  [0] = '#000000', '#cd0000', '#00cd00', '#cdcd00', '#0000ee', '#cd00cd', '#00cdcd', '#e5e5e5',
  '#7f7f7f', '#ff0000', '#00ff00', '#ffff00', '#5c5cff', '#ff00ff', '#00ffff', '#ffffff',
}

local PREFIX = 'AgentBashAnsi_'

--- Grey (256-colour index) for the dim groups when their link has no cterm colour: Neovim's
--- default scheme gives `Comment` a GUI colour only, so without 'termguicolors' a dimmed card
--- would look like any other.
M.cterm_grey = { AgentBashDim = 244, AgentBashMore = 244 }

--- Defines the plugin's groups (idempotent) and installs the ColorScheme autocmd once.
function M.setup()
  for name, link in pairs(M.groups) do
    local target = M.cterm_grey[name] and vim.api.nvim_get_hl(0, { name = link, link = false })
    if target and not target.ctermfg then
      -- The link's own GUI look, and a cterm colour it lacks.
      local attrs = vim.tbl_extend('force', target, { default = true, ctermfg = M.cterm_grey[name] })
      vim.api.nvim_set_hl(0, name, attrs)
    else
      vim.api.nvim_set_hl(0, name, { link = link, default = true })
    end
  end
  if H.augroup then
    return
  end
  H.augroup = vim.api.nvim_create_augroup('agent_bash_highlight', { clear = true })
  vim.api.nvim_create_autocmd('ColorScheme', {
    group = H.augroup,
    desc = 'agent-bash: re-apply highlight groups',
    callback = function()
      M.setup()
      for name, style in pairs(H.made) do
        H.define(name, style)
      end
      for _, slot in ipairs(H.slots) do
        H.define(slot.group, slot.style)
      end
    end,
  })
end

--- The group name for an SGR style (pure): `AgentBashAnsi_<key>`, or nil for the default style.
--- The key lists fg (`f`), bg (`b`) as an index or hex digits, then flags B D I U R S.
---@param style agent_bash.Style
---@return string?
function M.style_group(style)
  local parts = {}
  if style.fg ~= nil then
    parts[#parts + 1] = 'f' .. H.color_key(style.fg)
  end
  if style.bg ~= nil then
    parts[#parts + 1] = 'b' .. H.color_key(style.bg)
  end
  local flags = ''
  for _, f in ipairs(H.flags) do
    if style[f[1]] then
      flags = flags .. f[2]
    end
  end
  if flags ~= '' then
    parts[#parts + 1] = flags
  end
  if #parts == 0 then
    return nil
  end
  return PREFIX .. table.concat(parts, '_')
end

--- Defines the group for `style` and returns the name to use in extmarks. Neovim never frees
--- a highlight group, and truecolour output (lolcat, bat) has a new style on nearly every
--- character, so the number of groups is bounded: the first `M.max_named` distinct styles
--- keep the group named after them (`name`); later ones share `M.max_recycled` groups named
--- `AgentBashAnsi_lru<n>`, the least recently used one redefined for a new style.
---@param name string from style_group()
---@param style agent_bash.Style
---@return string group
function M.ensure(name, style)
  if H.made[name] then
    return name
  end
  H.tick = H.tick + 1
  local slot = H.lru[name]
  if slot then
    slot.used = H.tick
    return slot.group
  end
  if H.named < M.max_named then
    H.named = H.named + 1
    H.made[name] = style
    H.define(name, style)
    return name
  end
  if #H.slots < M.max_recycled then
    slot = { group = ('%slru%d'):format(PREFIX, #H.slots + 1) }
    H.slots[#H.slots + 1] = slot
  else
    slot = H.slots[1]
    for _, s in ipairs(H.slots) do
      if s.used < slot.used then
        slot = s
      end
    end
    H.lru[slot.key] = nil
  end
  slot.key, slot.style, slot.used = name, style, H.tick
  H.lru[name] = slot
  H.define(slot.group, style)
  return slot.group
end

--- Distinct styles that keep a group named after them, for the session.
M.max_named = 512
--- Groups shared by the styles past `max_named`, recycled least recently used first.
M.max_recycled = 256

--- The nvim_set_hl() attributes for an SGR style (pure): gui and cterm colours and flags.
---@param style agent_bash.Style
---@return vim.api.keyset.highlight
function M.attrs(style)
  local a, cterm = {}, {}
  for _, key in ipairs({ 'fg', 'bg' }) do
    local c = style[key]
    if c ~= nil then
      a[key] = M.hex(c)
      a['cterm' .. key] = type(c) == 'number' and c or M.nearest(c)
    end
  end
  for _, f in ipairs(H.flags) do
    local name = f[1]
    if style[name] and name ~= 'dim' then
      a[name] = true
      cterm[name] = true
    end
  end
  -- Neovim has no "dim" attribute: draw dim text without its own colour in grey.
  if style.dim and style.fg == nil then
    a.fg, a.ctermfg = M.hex(8), 8
  end
  if next(cterm) then
    a.cterm = cterm
  end
  return a
end

--- '#rrggbb' for a 0–255 colour index (0–15 follow g:terminal_color_N); hex passes through.
---@param c integer|string
---@return string
function M.hex(c)
  if type(c) == 'string' then
    return c:lower()
  end
  if c < 16 then
    local term = vim.g['terminal_color_' .. c]
    if type(term) == 'string' and term:match('^#%x%x%x%x%x%x$') then
      return term:lower()
    end
    return M.palette[c]
  end
  local r, g, b = H.rgb(c)
  return ('#%02x%02x%02x'):format(r, g, b)
end

--- The nearest xterm index (16–255) to a '#rrggbb' colour, for cterm.
---@param hex string
---@return integer
function M.nearest(hex)
  local r, g, b = tonumber(hex:sub(2, 3), 16), tonumber(hex:sub(4, 5), 16), tonumber(hex:sub(6, 7), 16)
  if not (r and g and b) then
    return 7
  end
  local best, dist = 16, math.huge
  for i = 16, 255 do
    local r2, g2, b2 = H.rgb(i)
    local d = (r - r2) ^ 2 + (g - g2) ^ 2 + (b - b2) ^ 2
    if d < dist then
      best, dist = i, d
    end
  end
  return best
end

-- Helpers -----------------------------------------------------------------------------------

H.made = {} ---@type table<string, agent_bash.Style> named groups
H.named = 0 -- entries in H.made
H.slots = {} ---@type {group: string, key: string, style: agent_bash.Style, used: integer}[]
H.lru = {} ---@type table<string, table> style key → its recycled slot
H.tick = 0 -- use counter for the recycled slots
H.flags = {
  { 'bold', 'B' },
  { 'dim', 'D' },
  { 'italic', 'I' },
  { 'underline', 'U' },
  { 'reverse', 'R' },
  { 'strikethrough', 'S' },
}
H.cube = { 0, 95, 135, 175, 215, 255 }

function H.color_key(c)
  if type(c) == 'string' then
    return (c:gsub('^#', ''):lower())
  end
  return tostring(c)
end

--- RGB of an xterm index 16–255 (6×6×6 cube, then the 24-step grey ramp).
function H.rgb(i)
  if i >= 232 then
    local v = 8 + 10 * (i - 232)
    return v, v, v
  end
  i = i - 16
  return H.cube[math.floor(i / 36) + 1], H.cube[math.floor(i / 6) % 6 + 1], H.cube[i % 6 + 1]
end

function H.define(name, style)
  vim.api.nvim_set_hl(0, name, M.attrs(style))
end

return M
